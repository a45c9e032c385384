"""A lagging optional sink catches up within the run, and the source reads each change once while
it lags (issue 13, item 11). Through ``serve``: PostgreSQL → file (required) + Redis (optional)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import serve_pipeline
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis, restart


def _spec(tmp: Path, pg: Postgres, rd: Redis) -> dict[str, Any]:
    return {
        "source": {"type": "postgres", "config": {"id": "pg", "dsn": pg.dsn(), "slot": "lag", "publication": "lag",
                                                  "heartbeat_ms": 500}},
        "sinks": [
            {"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}},
            {"type": "redis", "config": {"id": "r", "uri": rd.uri(), "stream": "cdc", "required": False}},
        ],
        "batch": {"max_events": 50, "max_ms": 20},
        "supervision": {"backoff": {"base_ms": 100, "max_ms": 1000}},
        "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
    }  # fmt: skip


def _file_ids(tmp: Path) -> list[int]:
    return [int(d["after"]["id"]) for d in jsonl(tmp / "events.jsonl") if d["op"] == "c"]


def _redis_ids(rd: Redis) -> list[int]:
    return [int(orjson.loads(f[b"event"])["after"]["id"]) for _, f in rd.client().xrange("cdc")]


async def _sql(pg: Postgres, *statements: str) -> Any:
    conn = await asyncpg.connect(pg.dsn())
    try:
        result = None
        for statement in statements:
            result = await conn.fetchval(statement)
        return result
    finally:
        await conn.close()


def _write(pg: Postgres, first: int, txs: int, rows: int = 10) -> None:
    """``txs`` transactions of ``rows`` inserts each, ids from ``first``."""

    async def run() -> None:
        conn = await asyncpg.connect(pg.dsn())
        for t in range(txs):
            base = first + t * rows
            await conn.executemany("INSERT INTO items VALUES ($1)", [(i,) for i in range(base, base + rows)])
        await conn.close()

    asyncio.run(run())


def test_a_lagging_optional_sink_catches_up_in_the_run_and_nothing_is_read_twice(tmp_path: Path) -> None:
    with Postgres() as pg, Redis() as rd:
        asyncio.run(_sql(pg, "CREATE TABLE items (id int PRIMARY KEY)"))
        with serve_pipeline(tmp_path, _spec(tmp_path, pg, rd)) as serve:
            _write(pg, 1, 10)  # ids 1-100
            wait_until_sync(lambda: len(_redis_ids(rd)) >= 100, timeout=60, what="redis has the first rows")
            rd.kill()
            _write(pg, 101, 40)  # ids 101-500 while redis is down: the file sink gets them
            wait_until_sync(
                lambda: len(set(_file_ids(tmp_path))) >= 500, timeout=60, what="file sink has all"
            )

            def lagging() -> bool:
                sinks = serve.get("/pipelines/shop").json()["counters"]["sinks"]
                return bool(sinks["r"]["lagging"])

            wait_until_sync(lagging, timeout=30, what="redis sink lagging")
            assert serve.get("/health").json()["status"] == "degraded"
            restart(rd)
            # Within the same run: no restart of serve.
            wait_until_sync(lambda: len(set(_redis_ids(rd))) >= 500, timeout=60, what="redis caught up")
            wait_until_sync(lambda: not lagging(), timeout=30, what="redis sink no longer lagging")
            _write(pg, 501, 10)  # and it keeps up afterwards
            wait_until_sync(lambda: len(set(_redis_ids(rd))) >= 600, timeout=60, what="redis keeps up")
            wait_until_sync(lambda: serve.get("/ready").status_code == 200, timeout=30, what="/ready 200")
            decoded = asyncio.run(
                _sql(pg, "SELECT total_txns FROM pg_stat_replication_slots WHERE slot_name = 'lag'")
            )
            assert serve.terminate() == 0
        redis_ids = _redis_ids(rd)
        file_ids = _file_ids(tmp_path)
    assert sorted(set(redis_ids)) == list(range(1, 601))
    assert [i for n, i in enumerate(redis_ids) if i not in redis_ids[:n]] == list(range(1, 601))  # in order
    assert file_ids == list(range(1, 601))  # the file sink skipped what the second reading repeated
    # 60 transactions were written. The slot was read once, plus once more from the Redis sink's
    # checkpoint when it came back (at most the 40 it missed): no re-reading per poll.
    assert 60 <= decoded <= 60 + 40 + 5, f"{decoded} transactions decoded for 60 written"
