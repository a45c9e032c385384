"""A lagging optional sink catches up within the run, and the source reads each change once while
it lags (issue 13, item 11). Through ``serve``: PostgreSQL → file (required) + Redis (optional)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.plugins import build_sink
from deltaforge.position import Position
from deltaforge.sinks.base import RetryableSinkError
from deltaforge.sources.base import PositionLost
from deltaforge.sources.mysql.retention import BinlogRetention
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from tests.helpers import jsonl, wait_until, wait_until_sync
from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc
from tests.mysql_kit import fresh_db
from tests.serve_proc import serve_pipeline
from tests.servers.mariadb import CDC_USER, MariaDB
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


class ProbedB(ScriptedSink):
    """The scripted sink b, whose probe fails too while its pipeline's b is ``down``."""

    def __init__(self, pipe: FileAndB) -> None:
        super().__init__("b", required=False, script=pipe._b)
        self.pipe = pipe

    async def reachable(self) -> None:
        if self.pipe.down:
            raise RetryableSinkError("b is down")


class FileAndB:
    """A MariaDB pipeline of table ``t`` into a file sink f (required) and a scripted optional
    sink b, which fails while ``down``; ``got`` holds the ids b took. b answers the lagging
    sinks' probe all along (it comes back, fails again: the source is read again for it over and
    over) unless ``probed``, when its probe fails while it is down."""

    def __init__(
        self, mariadb: MariaDB, db: str, tmp_path: Path, probed: bool = False, **source: Any
    ) -> None:
        self.down, self.got, self.path, self.probed = False, set[int](), tmp_path / "f.jsonl", probed
        source = {"id": "my", "dsn": mariadb.dsn(db), "tables": [f"{db}.t"], **source}
        self.doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "fb"}, "spec": {
            "source": {"type": "mysql", "config": source},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(self.path)}},
                      {"type": "stdout", "config": {"id": "b", "required": False}}],
            "batch": {"max_events": 10, "max_ms": 20}, "supervision": {"backoff": {"base_ms": 50, "max_ms": 200}},
        }}  # fmt: skip

    def _b(self, call: int, events: list[Event]) -> None:
        if self.down:
            raise RetryableSinkError("b is down")
        self.got.update(int(e.after["id"]) for e in events if e.after is not None and e.table == "t")

    def runner(self, store: MemoryCheckpointStore) -> PipelineRunner:
        cfg = parse_pipeline(self.doc, env={})
        b = ProbedB(self) if self.probed else ScriptedSink("b", required=False, script=self._b)
        return PipelineRunner(cfg, store=store, sinks={"f": build_sink(cfg.sinks[0]), "b": b})

    def in_f(self) -> set[int]:
        return {int(d["after"]["id"]) for d in jsonl(self.path) if d["after"]}


@pytest.mark.parametrize("mode", ["never", "initial"])
async def test_an_optional_sink_whose_position_is_lost_never_stops_the_others(
    mariadb: MariaDB, tmp_path: Path, mode: str
) -> None:
    """An optional sink down long enough for the server to purge the binlog its checkpoint is in:
    when it answered again, the rewind to its checkpoint was position lost, and the whole
    pipeline failed, the required sink with it (it never got the next row). Now only that sink's
    position is lost: ``sink_position_lost`` names it, the source opens from the others'
    checkpoints, and with a snapshot mode the sink is given a snapshot, as a sink added is
    (it ends holding every row); under ``never`` it is parked: nothing more goes to it, in this
    run or the next start, which the others go on through."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"GRANT CREATE, INSERT, UPDATE ON {db}.* TO '{CDC_USER}'@'%'")  # the signal table
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (100)")
    pipe, store = FileAndB(mariadb, db, tmp_path, snapshot={"mode": mode}), MemoryCheckpointStore()
    got, in_f = pipe.got, pipe.in_f

    def insert(i: int) -> None:
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO t VALUES ({i})")

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[PipelineRunner]:
        runner = pipe.runner(store)
        task = asyncio.create_task(runner.run())
        try:
            yield runner
        finally:
            await runner.drain()
            await asyncio.wait_for(task, 30)

    with capture_logs() as logs:
        async with running() as runner:
            await wait_until(lambda: 100 in got and 100 in in_f(), timeout=30, what="the first row in both")
            pipe.down = True
            insert(1)
            await wait_until(lambda: runner.ctx.stats.sinks["b"].lagging, timeout=30, what="b lagging")
            with mariadb.root() as c, c.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                held = cur.fetchone()[0]
            mariadb.purge_all_but_newest(held)  # the file b's checkpoint is in
            insert(2)
            await wait_until(lambda: {1, 2} <= in_f(), timeout=30, what="f goes on")
            pipe.down = False
            insert(3)
            # Under never, 3 can reach f before b answers again and its rewind is found lost:
            # the event waited on is the loss said, as well as 3 delivered.
            await wait_until(
                lambda: (
                    3 in in_f()
                    and (mode == "never" or 3 in got)
                    and any(e["event"] == "sink_position_lost" for e in logs)
                ),
                timeout=30,
                what="3 delivered and b's position said lost",
            )
            assert runner.failure is None
        said = [(e["sinks"], e["action"]) for e in logs if e["event"] == "sink_position_lost"]
        assert said == [(["b"], "parked" if mode == "never" else "snapshot")]
        assert got == ({100} if mode == "never" else {100, 1, 2, 3})
        async with running() as runner:  # the next start
            insert(4)
            await wait_until(
                lambda: 4 in in_f() and (mode == "never" or 4 in got), timeout=30, what="4 delivered"
            )
            assert runner.failure is None
    said = [(e["sinks"], e["action"]) for e in logs if e["event"] == "sink_position_lost"]
    assert said == [(["b"], "parked")] * 2 if mode == "never" else [(["b"], "snapshot")]
    assert got == ({100} if mode == "never" else {100, 1, 2, 3, 4})


async def test_a_sink_behind_whose_binlog_is_the_oldest_left_is_warned_of(
    mariadb: MariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL says the WAL a slot keeps for a sink behind; MariaDB said nothing until the
    binlog that sink needs was purged, and the next opening was position lost. Now, while a sink
    is behind: ``binlog_at_risk`` once the file holding the first transaction it needs is the
    oldest left with newer ones (the next purge takes it), ``binlog_purged_under_checkpoint``
    once it is gone, and the bytes from its checkpoint on in ``retained_bytes``. A pipeline
    caught up whose file is purged needs nothing from it (its GTID is in the newest file's list)
    and is told nothing. (b is down to probes too: one that answers them is read for again and
    again, and a reading from its checkpoint once the purge is done would find it lost at once,
    ``sink_position_lost``, before a look saw the purge.)"""
    monkeypatch.setattr(BinlogRetention, "every_s", 0.05)
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (100)")
    pipe = FileAndB(mariadb, db, tmp_path, probed=True)
    runner = pipe.runner(MemoryCheckpointStore())

    def sql(*statements: str) -> str:
        with mariadb.root(db) as c, c.cursor() as cur:
            for s in statements:
                cur.execute(s)
            cur.execute("SHOW MASTER STATUS")
            return str(cur.fetchone()[0])

    async def looked(times: int) -> None:
        retention = runner.ctx.source.retention  # type: ignore[attr-defined]
        start = retention.looks
        await wait_until(lambda: retention.looks >= start + times, timeout=30, what=f"{times} looks")

    def said() -> list[tuple[str, str]]:
        return [(e["event"], e["file"]) for e in logs if e["event"].startswith("binlog_")]

    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: 100 in pipe.got, timeout=30, what="the first row delivered")
        mariadb.purge_all_but_newest(sql())  # the caught-up checkpoint's file: needed by nobody
        await looked(3)
        assert said() == []
        pipe.down = True
        needed = sql("INSERT INTO t VALUES (1)")
        await wait_until(lambda: runner.ctx.stats.sinks["b"].lagging, timeout=30, what="b lagging")
        await looked(3)
        assert said() == []  # the file b needs is the only one
        sql("FLUSH BINARY LOGS", "INSERT INTO t VALUES (2)")
        await wait_until(lambda: said() != [], timeout=30, what="binlog_at_risk")
        assert said() == [("binlog_at_risk", needed)]
        assert (runner.ctx.source.retained_bytes or 0) > 0
        mariadb.purge_all_but_newest(needed)
        await wait_until(lambda: len(said()) == 2, timeout=30, what="binlog_purged_under_checkpoint")
        assert said()[1] == ("binlog_purged_under_checkpoint", needed)
        await runner.drain()
        await asyncio.wait_for(task, 30)


class LostOnRead(SyntheticSource):
    """Opening from behind ``gone`` succeeds, and the first read then finds the position lost, as
    MariaDB says it (the binlog dump's error 1236 comes after the opening's own check passed: a
    purge in between)."""

    def __init__(self, total: int, gone: int) -> None:
        super().__init__(total, chunk=50)
        self.gone = gone
        self.behind = False

    async def open(self, resume_after: Position | None) -> None:
        await super().open(resume_after)
        self.behind = self.next <= self.gone

    async def read(self) -> list[Event]:
        if self.behind:
            raise PositionLost("the binlog from the checkpoint was purged")
        return await super().read()


async def test_an_optional_sink_whose_position_is_found_lost_while_reading_never_stops_the_others() -> None:
    """An optional sink behind, whose position the server turned out not to have at the first
    read rather than at the opening (a purge between MariaDB's check and its binlog dump): the
    pipeline failed, the required sink with it. Now the same as at an opening: the optional sink
    is named and parked, the source opens again from the others' checkpoints."""
    store = MemoryCheckpointStore()
    await store.put_many({sink_key("src", "a"): {"seq": 50}, sink_key("src", "b"): {"seq": 10}})
    a, b = ScriptedSink("a"), ScriptedSink("b", required=False)
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)])
    runner = PipelineRunner(cfg, store=store, source=LostOnRead(200, gone=20), sinks={"a": a, "b": b})
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        try:
            await wait_until(
                lambda: 200 in a.received or task.done(), timeout=60, what="a given every change"
            )
            await runner.drain()
        finally:
            runner.stop_now()
            await asyncio.gather(task, return_exceptions=True)
    assert runner.failure is None
    assert a.received == list(range(51, 201))
    assert b.received == []  # parked: snapshot.mode never
    assert [e["sinks"] for e in logs if e["event"] == "sink_position_lost"] == [["b"]]
