"""A PostgreSQL server at one of its limits is there, and lets the source in once something lets
go: the source is unavailable meanwhile (``degraded``, in the server's words) and reads once it
is let in. A crash instead would count against the pipeline's restarts, and fail it in seconds
over a limit that an operator, or another client's exit, lifts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import psycopg
import pytest

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import ScriptedSink
from tests.servers.postgres import Postgres

LIMITS = {
    # "sorry, too many clients already" (53300): others' connections close
    "max_connections": ("max_connections = 12\nsuperuser_reserved_connections = 0\n", "too many clients"),
    # creating the slot: "all replication slots are in use" (53400): another is dropped
    "max_replication_slots": ("max_replication_slots = 1\n", "all replication slots are in use"),
    # the stream's connection: "number of requested standby connections exceeds max_wal_senders"
    "max_wal_senders": ("max_wal_senders = 1\n", "exceeds max_wal_senders"),
}

LetGo = Callable[[], Awaitable[None]]


async def _at_limit(pg: Postgres, limit: str) -> LetGo:
    """The server at ``limit``, held there by this test until the returned call lets go."""
    if limit == "max_connections":
        hogs = []
        while True:
            try:
                hogs.append(await asyncpg.connect(pg.dsn()))
            except asyncpg.TooManyConnectionsError:
                break

        async def close_all() -> None:
            for hog in hogs:
                await hog.close()

        return close_all
    if limit == "max_replication_slots":
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("SELECT pg_create_logical_replication_slot('another', 'pgoutput')")

        async def drop() -> None:
            await conn.execute("SELECT pg_drop_replication_slot('another')")
            await conn.close()

        return drop
    stream = await psycopg.AsyncConnection.connect(pg.dsn(), autocommit=True, replication="database")
    await stream.execute("IDENTIFY_SYSTEM")  # the server's one walsender
    return stream.close


@pytest.mark.parametrize("limit", sorted(LIMITS))
async def test_a_server_at_one_of_its_limits_is_waited_for_not_a_failure(limit: str) -> None:
    settings, words = LIMITS[limit]
    with Postgres() as pg:  # its own: the limit would refuse the other tests
        _restart_with(pg, settings)
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        let_go = await _at_limit(pg, limit)
        doc = {
            "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "busy"},
            "spec": {"source": {"type": "postgres", "config": {"id": "pg", "dsn": pg.dsn(), "tables": ["public.t"]}},
                     "sinks": [{"type": "stdout", "config": {"id": "a"}}],
                     "supervision": {"max_restarts": 5, "within_seconds": 60, "backoff": {"base_ms": 100, "max_ms": 500}}},
        }  # fmt: skip
        runner = PipelineRunner(
            parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), sinks={"a": ScriptedSink("a")}
        )
        task = asyncio.create_task(runner.run())
        try:

            def said() -> str:
                return str(runner.ctx.availability.view().get("source", {}).get("last_error", ""))

            await wait_until(lambda: words in said() or runner.state == "failed", timeout=30,
                             what="the source listed unavailable")  # fmt: skip
            assert runner.state == "running", runner.failure
            await let_go()
            await wait_until(lambda: (r := runner.snapshot().find("SourceReader")) is not None and r.state == "running",
                             timeout=60, what="the source open")  # fmt: skip
            await conn.execute("INSERT INTO t VALUES (1)")
            await wait_until(
                lambda: runner.ctx.stats.events_committed >= 1, timeout=60, what="the row delivered"
            )
            assert runner.state == "running"
        finally:
            runner.stop_now()
            await asyncio.wait_for(task, 30)
            await conn.close()


def _restart_with(pg: Postgres, settings: str) -> None:
    """``pg`` stopped, ``settings`` appended to its postgresql.conf, started again."""
    pg.halt()
    with open(pg.data / "postgresql.conf", "a") as conf:
        conf.write(settings)
    pg.resume()
