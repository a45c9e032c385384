"""Adaptive batching: a batch goes on as soon as the source is caught up, and grows only while
more is waiting (issue 18). ``max_ms`` is an hour here, so no timed flush can stand in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from actors import Actor, ActorCell
from deltaforge.config import parse_pipeline
from deltaforge.pipeline.accumulator import Accumulator
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import DeliverBatch, EventsRead
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import Source
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import jsonl, wait_until
from tests.kit import SyntheticSource, config, make_event
from tests.mysql_kit import fresh_db as my_fresh_db
from tests.mysql_kit import source as my_source
from tests.postgres_kit import fresh_db as pg_fresh_db
from tests.postgres_kit import source as pg_source
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.test_turso_source import source as turso_source
from tests.test_turso_source import writer as turso_writer

HOUR_MS = 3_600_000


class Batches(Actor):
    """Stands in for the coordinator: records each batch's sequence numbers."""

    def __init__(self, got: list[list[int]]) -> None:
        super().__init__()
        self.got = got

    async def receive(self, message: Any) -> Any:
        assert isinstance(message, DeliverBatch)
        self.got.append([e.order[0] for e in message.batch.events])


def chunk(first: int, n: int) -> list[Any]:
    return [make_event(s, tx=s) for s in range(first, first + n)]


async def feed(chunks: list[tuple[int, bool]], max_events: int = 25) -> list[list[int]]:
    """Tell the Accumulator chunks of ``(size, caught_up)``; the batches it has handed on once
    every task is blocked (nothing more can happen without a new message or the hour passing)."""
    got: list[list[int]] = []
    ctx = PipelineContext(
        config(batch={"max_events": max_events, "max_ms": HOUR_MS}),
        MemoryCheckpointStore(),
        SyntheticSource(0),
        {},
    )
    sink = ActorCell("batches", lambda: Batches(got))
    acc = ActorCell("acc", lambda: Accumulator(ctx, sink.ref))  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(sink.run)
        await tg.start(acc.run)
        seq = 1
        for size, caught_up in chunks:
            await acc.ref.tell(EventsRead(chunk(seq, size), 0, caught_up))
            seq += size
            await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    return got


@pytest.mark.anyio
async def test_a_caught_up_chunk_goes_on_at_once() -> None:
    assert await feed([(3, True)]) == [[1, 2, 3]]


@pytest.mark.anyio
async def test_a_batch_grows_while_more_is_waiting_and_goes_once_caught_up() -> None:
    got = await feed([(10, False), (10, False)])
    assert got == []  # 20 < max_events and more is coming: wait for it
    got = await feed([(10, False), (10, False), (10, False), (7, True)])
    assert got == [list(range(1, 26)), list(range(26, 38))]  # cut at the limit, then the rest at once


# -- through real sources: with max_ms an hour, each committed row still arrives ----------------


async def one_row_at_a_time(
    source: Source,
    write: Callable[[int], Awaitable[None]],
    tmp: Path,
    capturing: Callable[[], Awaitable[bool]],
) -> None:
    """A pipeline from ``source`` to a file with ``max_ms`` an hour: three rows written one by
    one each reach the file before the next is written: the source said it was caught up."""
    out = tmp / "events.jsonl"
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "adaptive"},
        "spec": {
            "source": {"type": "turso", "config": {"id": source.id, "path": str(tmp / "unused.db")}},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}],
            "batch": {"max_events": 10_000, "max_ms": HOUR_MS},
        },
    }
    runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), source=source)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        await wait_until(lambda: runner.state == "running", timeout=30, what="pipeline running")
        while not await capturing():
            await anyio.sleep(0.01)
        for i in (1, 2, 3):
            await write(i)
            await wait_until(lambda: len(rows_of(out)) == i, timeout=20, what=f"row {i} in the file")  # noqa: B023
        assert [r["after"]["id"] for r in rows_of(out)] == [1, 2, 3]
        await runner.drain()


async def always() -> bool:
    return True  # no checkpoint: the source reads from its oldest change


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [d for d in jsonl(out) if d.get("op") == "c"]


@pytest.mark.anyio
async def test_postgres_rows_arrive_one_by_one_with_max_ms_an_hour(
    postgres: Postgres, tmp_path: Path
) -> None:
    db = await pg_fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")

        async def write(i: int) -> None:
            await conn.execute("INSERT INTO t VALUES ($1, 'x')", i)

        async def slot_exists() -> bool:
            found = await conn.fetchval(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f"s_{db}"
            )
            return bool(found)

        await one_row_at_a_time(pg_source(postgres, db), write, tmp_path, slot_exists)
    finally:
        await conn.execute("SELECT pg_drop_replication_slot($1)", f"s_{db}")  # the session's slots are few
        await conn.close()


@pytest.mark.anyio
async def test_mariadb_rows_arrive_one_by_one_with_max_ms_an_hour(mariadb: MariaDB, tmp_path: Path) -> None:
    db = my_fresh_db(mariadb)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v TEXT)")

    async def write(i: int) -> None:
        with mariadb.root() as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO {db}.t VALUES (%s, 'x')", (i,))

    await one_row_at_a_time(my_source(mariadb, [f"{db}.t"]), write, tmp_path, always)


@pytest.mark.anyio
async def test_turso_rows_arrive_one_by_one_with_max_ms_an_hour(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = turso_writer(path)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    conn.commit()

    async def write(i: int) -> None:
        conn.execute("INSERT INTO t VALUES (?, 'x')", (i,))
        conn.commit()

    await one_row_at_a_time(turso_source(path), write, tmp_path, always)
