"""The MySQL/MariaDB binlog source against a real private MariaDB."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from chaos.harness import ProxyServer, port_of
from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import PositionLost, SourceError, SourceMisconfigured, SourceUnavailable
from deltaforge.sources.mysql.checks import MySQLSettings
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.source import MySQLSource
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import damage_on_disk, wait_until
from tests.servers.mariadb import MariaDB

_db_counter = itertools.count(1)


def fresh_db(server: MariaDB) -> str:
    name = f"shop{next(_db_counter)}"
    with server.root() as c, c.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    return name


def source(server: MariaDB, tables: list[str], **extra: Any) -> MySQLSource:
    return MySQLSource(MySQLSourceConfig(id="my", dsn=server.dsn(), tables=tables, **extra), tenant="acme")


def to_file(
    server: MariaDB, name: str, tables: str, out: Path, store: MemoryCheckpointStore
) -> PipelineRunner:
    """A pipeline from ``tables`` to a JSONL file ``out``, checkpoints in ``store``."""
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "source": {"type": "mysql", "config": {"id": "my", "dsn": "${DSN}", "tables": [tables]}},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}],
            "storage": {"type": "memory"},
        },
    }
    return PipelineRunner(parse_pipeline(doc, env={"DSN": server.dsn()}), store=store)


async def read_n(src: MySQLSource, n: int, timeout: float = 30) -> list[Event]:
    out: list[Event] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < n:
        if loop.time() > deadline:
            raise AssertionError(f"read {len(out)} of {n} events")
        out.extend(e for e in await src.read() if e.op != "h")  # heartbeats: see the idle test
    return out


TYPES_DDL = """CREATE TABLE {db}.types (
    id INT PRIMARY KEY, big BIGINT, tiny TINYINT, dec_ DECIMAL(12,4), fl FLOAT, dbl DOUBLE,
    vc VARCHAR(50), txt TEXT, bl BLOB, d DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL, j JSON,
    e ENUM('red','green'), s SET('a','b','c'), nul INT NULL
) CHARACTER SET utf8mb4"""


async def test_mixed_workload_in_commit_order_with_typed_values(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(TYPES_DDL.format(db=db))
        cur.execute(f"CREATE TABLE {db}.other (id INT PRIMARY KEY, v INT)")
        cur.execute(f"CREATE TABLE {db}.ignored (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.types", f"{db}.other"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            "INSERT INTO types VALUES (1, 9007199254740993, -5, 12345678.1234, 1.5, -2.25e100, 'héllo ✓ 😀', "
            "REPEAT('t', 3000), x'00ff10', '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.500', "
            "'{\"k\": [1, \"two\"]}', 'green', 'a,c', NULL)"
        )
        c.begin()  # a multi-table transaction
        cur.execute("UPDATE types SET vc = 'changed', nul = 7 WHERE id = 1")
        cur.execute("INSERT INTO other VALUES (1, 1)")
        cur.execute("INSERT INTO ignored VALUES (1)")
        c.commit()
        c.begin()  # a 1000-row transaction
        cur.executemany("INSERT INTO other VALUES (%s, %s)", [(i, i) for i in range(2, 1002)])
        c.commit()
        cur.execute("DELETE FROM types WHERE id = 1")
        cur.execute("UPDATE other SET v = v + 1 WHERE id <= 3")
    events = await read_n(src, 1 + 2 + 1000 + 1 + 3)
    await src.close()

    assert [(e.op, e.table) for e in events[:3]] == [("c", "types"), ("u", "types"), ("c", "other")]
    assert "ignored" not in {e.table for e in events}
    after = events[0].after
    assert after is not None
    assert events[0].source.key == ("id",)  # from the table map's metadata
    assert after["big"] == 9007199254740993 and after["tiny"] == -5
    assert after["dec_"] == Decimal("12345678.1234")
    assert after["fl"] == 1.5 and after["dbl"] == -2.25e100
    assert after["vc"] == "héllo ✓ 😀" and after["txt"] == "t" * 3000
    assert after["bl"] == b"\x00\xff\x10"
    assert after["d"] == dt.date(2024, 2, 29)
    assert after["dtm"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert after["ts"] == dt.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=dt.UTC)  # an instant: UTC, aware
    assert after["j"] == '{"k": [1, "two"]}'  # MariaDB's JSON is LONGTEXT
    assert after["e"] == "green" and after["s"] == {"a", "c"} and after["nul"] is None
    upd = events[1]
    assert upd.before is not None and upd.after is not None
    assert upd.before["vc"] == "héllo ✓ 😀" and upd.after["vc"] == "changed" and upd.after["nul"] == 7
    # transaction boundaries: the multi-table tx ends at 'other', the big one at its last row
    assert [e.tx_end for e in events[:3]] == [True, False, True]
    assert events[1].tx_id == events[2].tx_id
    big = events[3:1003]
    assert len({e.tx_id for e in big}) == 1 and [e.tx_end for e in big].count(True) == 1 and big[-1].tx_end
    assert [e.after["id"] for e in big if e.after] == list(range(2, 1002))
    dele = events[1003]
    assert dele.op == "d" and dele.after is None and dele.before is not None and dele.before["id"] == 1
    assert [e.after["v"] for e in events[1004:] if e.after] == [2, 3, 4]
    assert [e.order for e in events] == sorted(e.order for e in events)
    assert events[-1].checkpoint.gtid.startswith("0-1-")
    key = events[0].idempotency_key
    assert key == f"acme|{db}.types|{events[0].tx_id}|{events[0].event_id}"


async def test_resume_from_a_checkpoint_continues_after_it(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        for i in range(10):
            cur.execute("INSERT INTO t VALUES (%s)", (i,))
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    first = await read_n(src, 10)
    await src.close()
    src2 = source(mariadb, [f"{db}.t"])
    await src2.open(first[5].checkpoint)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (10)")
    rest = await read_n(src2, 5)
    await src2.close()
    assert [e.after["id"] for e in rest if e.after] == [6, 7, 8, 9, 10]
    assert [e.idempotency_key for e in rest[:4]] == [e.idempotency_key for e in first[6:]]


async def test_added_column_appears_after_alter_and_schema_is_recorded(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        cur.execute("INSERT INTO t VALUES (1, 1)")
        cur.execute("ALTER TABLE t ADD COLUMN extra VARCHAR(10)")
        cur.execute("INSERT INTO t VALUES (2, 2, 'new')")
        cur.execute("UPDATE t SET extra = 'x' WHERE id = 1")
    out = tmp_path / "events.jsonl"
    store = MemoryCheckpointStore()
    runner = to_file(mariadb, "ddl", f"{db}.*", out, store)
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 3, timeout=30, what="3 events")
    await runner.drain()
    await task
    import orjson

    rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert rows[0]["after"] == {"id": 1, "v": 1}
    assert rows[1]["after"] == {"id": 2, "v": 2, "extra": "new"}
    assert rows[2]["before"] == {"id": 1, "v": 1, "extra": None} and rows[2]["after"]["extra"] == "x"
    history = await store.schema_history("my", f"{db}.t")
    assert [[c["name"] for c in h["columns"]] for h in history] == [["id", "v"], ["id", "v", "extra"]]
    assert history[1]["position"]["pos"] > history[0]["position"]["pos"]
    assert history[1]["position"]["file"].startswith("mysql-bin.")


async def test_purged_binlog_is_position_lost(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    [ev] = await read_n(src, 1)
    await src.close()
    purge_all_but_newest(mariadb, ev.checkpoint.file)
    src2 = source(mariadb, [f"{db}.t"])
    with pytest.raises(PositionLost) as info:
        await src2.open(ev.checkpoint)
    msg = str(info.value)
    assert msg.startswith(f"position lost: binlog file {ev.checkpoint.file} is no longer on the server")
    assert msg.endswith("Re-snapshot required.")


def purge_all_but_newest(server: MariaDB, gone: str) -> None:
    server.purge_all_but_newest(gone)


def purge_before(server: MariaDB, keep: str) -> None:
    """Purge every binlog before ``keep`` (retried: a closing dump thread may still hold one)."""
    import time

    deadline = time.monotonic() + 15
    with server.root() as c, c.cursor() as cur:
        while True:
            cur.execute(f"PURGE BINARY LOGS TO '{keep}'")
            cur.execute("SHOW BINARY LOGS")
            if next(r[0] for r in cur.fetchall()) == keep:
                return
            assert time.monotonic() < deadline, f"binlogs before {keep} were not purged"
            time.sleep(0.1)


async def test_gtid_ahead_of_server_is_position_lost(mariadb: MariaDB) -> None:
    src = source(mariadb, ["x.t"])
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file = cur.fetchone()[0]
    with pytest.raises(PositionLost, match=r"GTID 0-1-999999 is ahead of the server's binlog state"):
        await src.open(src.load_position({"file": file, "pos": 4, "row": 0, "gtid": "0-1-999999"}))


async def test_missing_privileges_are_named(mariadb: MariaDB) -> None:
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'weak'@'%' IDENTIFIED BY 'weak-pw'")
        cur.execute("GRANT SELECT ON *.* TO 'weak'@'%'")
    src = MySQLSource(MySQLSourceConfig(id="w", dsn=mariadb.dsn(user="weak", password="weak-pw")))
    with pytest.raises(SourceMisconfigured) as info:
        await src.open(None)
    assert "user lacks REPLICATION SLAVE, BINLOG MONITOR" in str(info.value)
    assert "weak-pw" not in str(info.value)


async def test_wrong_password_is_clear_and_does_not_leak(mariadb: MariaDB) -> None:
    src = MySQLSource(MySQLSourceConfig(id="w", dsn=mariadb.dsn(password="not-the-pw")))
    with pytest.raises(SourceMisconfigured, match="access denied") as info:
        await src.open(None)
    assert "not-the-pw" not in str(info.value)


def test_statement_format_fails_at_start_saying_what_to_set() -> None:
    with MariaDB(extra_args=["--binlog-format=STATEMENT"], server_id=7) as server:
        src = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn()))
        with pytest.raises(SourceMisconfigured) as info:
            asyncio.run(src.open(None))
    msg = str(info.value)
    assert "binlog_format is STATEMENT; set binlog_format=ROW (--binlog-format=ROW)" in msg


def test_compressed_binlog_is_refused_at_start_saying_what_to_set() -> None:
    with MariaDB(extra_args=["--log-bin-compress=ON"], server_id=8) as server:
        src = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn()))
        with pytest.raises(SourceMisconfigured) as info:
            asyncio.run(src.open(None))
    assert "log_bin_compress is ON; set log_bin_compress=OFF" in str(info.value)


def test_compressed_events_met_while_reading_halt_with_their_coordinates_never_skip() -> None:
    """Compression switched on while the reader runs: rows it cannot decode stop it, with where."""

    async def scenario(server: MariaDB) -> str:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE z")
            cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY, note VARCHAR(200))")
            cur.execute("INSERT INTO z.t VALUES (1, 'plain')")
        src = source(server, ["z.t"])
        await src.open(None)
        first = await read_n(src, 1)
        assert first[0].after == {"id": 1, "note": "plain"}
        with server.root() as c, c.cursor() as cur:
            cur.execute("SET GLOBAL log_bin_compress_min_len = 10")
            cur.execute("SET GLOBAL log_bin_compress = ON")
        with server.root() as c, c.cursor() as cur:  # a new session: the setting applies
            cur.execute("INSERT INTO z.t VALUES (2, %s)", ("x" * 150,))
        try:
            with pytest.raises(SourceMisconfigured) as info:
                await read_n(src, 1)
            return str(info.value)
        finally:
            await src.close()

    with MariaDB(server_id=9) as server:
        msg = asyncio.run(scenario(server))
    assert "a MariaDB compressed" in msg and "at mysql-bin.000001:" in msg
    assert "set log_bin_compress=OFF" in msg


def test_a_damaged_binlog_event_stops_the_source_and_its_rows_are_never_delivered() -> None:
    """A byte changed in a closed binlog file on the server's disk. MariaDB's dump thread sends it
    as it is (master_verify_checksum is OFF by default); the event fails its CRC32, so reading
    fails saying where, and the damaged row never becomes an event."""

    async def scenario(server: MariaDB) -> str:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE z")
            cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY, note VARCHAR(200))")
            cur.execute("INSERT INTO z.t VALUES (1, 'plain')")
            cur.execute("INSERT INTO z.t VALUES (2, 'the original note')")
            cur.execute("FLUSH BINARY LOGS")  # mysql-bin.000001 is closed: nothing writes it again
        damage_on_disk(server.data / "mysql-bin.000001", b"the original note")
        src = source(server, ["z.t"])
        await src.open(src.load_position({"file": "mysql-bin.000001", "pos": 4, "row": 0, "gtid": ""}))
        try:
            seen: list[Event] = []
            with pytest.raises(SourceError) as info:
                while len(seen) < 2:  # the damaged row, delivered, ends it too
                    seen.extend(e for e in await src.read() if e.op != "h")
            assert [e.after for e in seen] == [{"id": 1, "note": "plain"}]
            return str(info.value)
        finally:
            await src.close()

    with MariaDB(server_id=11) as server:
        msg = asyncio.run(scenario(server))
    assert "the binlog event at mysql-bin.000001:" in msg and "does not match its CRC32 checksum" in msg


def test_a_pipeline_meeting_a_damaged_binlog_event_halts_saying_where_after_what_came_before(
    tmp_path: Path,
) -> None:
    """Through the pipeline: it resumes from its checkpoint into a damaged event, restarts its
    source (a damage in transit would be cured), then halts with the event's coordinates; the
    file holds what came before it and none of the damaged row."""

    async def scenario(server: MariaDB) -> str | None:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE z")
            cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY, note VARCHAR(200))")
            cur.execute("INSERT INTO z.t VALUES (1, 'plain')")
        out, store = tmp_path / "events.jsonl", MemoryCheckpointStore()
        runner = to_file(server, "crc", "z.t", out, store)  # no checkpoint: from the oldest binlog
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed >= 1, timeout=30, what="row 1")
        await runner.drain()
        await task
        with server.root() as c, c.cursor() as cur:
            cur.execute("INSERT INTO z.t VALUES (2, 'the original note')")
            cur.execute("FLUSH BINARY LOGS")
        damage_on_disk(server.data / "mysql-bin.000001", b"the original note")
        runner = to_file(server, "crc", "z.t", out, store)
        task = asyncio.create_task(runner.run())

        def ids() -> list[int]:
            return [orjson.loads(x)["after"]["id"] for x in out.read_bytes().splitlines()]

        await wait_until(lambda: task.done() or len(ids()) > 1, timeout=120, what="a halt (or row 2)")
        if not task.done():  # the damaged row was delivered: stop, then fail below
            await runner.drain()
            await task
        assert ids() == [1]
        assert runner.state == "failed"
        return runner.failure

    with MariaDB(server_id=12) as server:
        reason = asyncio.run(scenario(server))
    assert reason is not None and "does not match its CRC32 checksum" in reason, reason
    assert "the binlog event at mysql-bin.000001:" in reason


async def test_timestamp_is_an_instant_in_utc_and_datetime_a_wall_clock(mariadb: MariaDB) -> None:
    """TIMESTAMP is stored as UTC and comes out aware, whatever the writer's time zone; DATETIME
    has no zone and stays naive, so the two are never confused."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, at TIMESTAMP(6) NULL, wall DATETIME(6))")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET time_zone = '+05:00'")
        cur.execute("INSERT INTO t VALUES (1, '2024-05-06 12:08:09.5', '2024-05-06 12:08:09.5')")
        cur.execute("UPDATE t SET at = '2024-05-06 13:00:00' WHERE id = 1")
    created, updated = await read_n(src, 2)
    await src.close()
    assert created.after == {
        "id": 1,
        "at": dt.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=dt.UTC),
        "wall": dt.datetime(2024, 5, 6, 12, 8, 9, 500000),
    }
    assert updated.before is not None and updated.before["at"] == created.after["at"]
    assert updated.after is not None and updated.after["at"] == dt.datetime(2024, 5, 6, 8, 0, tzinfo=dt.UTC)


async def test_checkpoints_move_while_only_uncaptured_tables_change(mariadb: MariaDB) -> None:
    """Heartbeats: transactions on uncaptured tables move the position, so a checkpoint does not
    stay in an old binlog until it is purged (which made the next start a false position lost)."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
        cur.execute(f"CREATE TABLE {db}.noise (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        cur.execute(f"INSERT INTO {db}.t VALUES (1)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    assert [e.after for e in await read_n(src, 1)] == [{"id": 1}]
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        newest = cur.fetchone()[0]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    beat = None
    while beat is None:
        assert loop.time() < deadline, "no heartbeat in the newest binlog"
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO {db}.noise (v) VALUES (1)")
        for e in await src.read():
            assert e.op == "h", e  # nothing of noise is delivered
            if e.checkpoint.file == newest:
                beat = e
    await src.close()
    purge_before(mariadb, newest)  # the binlogs the captured table was last written in are gone
    again = source(mariadb, [f"{db}.t"])
    await again.open(beat.checkpoint)  # the heartbeat's checkpoint is still on the server
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (2)")
    assert [e.after for e in await read_n(again, 1)] == [{"id": 2}]
    await again.close()


async def test_mariadb_resume_continues_every_gtid_domain(mariadb: MariaDB) -> None:
    """With writes in two GTID domains, a resume must continue both where they were, not re-read
    the domain the last transaction was not in from its start."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, domain INT)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET SESSION gtid_domain_id = 7")
        cur.execute(f"INSERT INTO {db}.t VALUES (1, 7)")
        cur.execute(f"INSERT INTO {db}.t VALUES (2, 7)")
        cur.execute("SET SESSION gtid_domain_id = 0")
        cur.execute(f"INSERT INTO {db}.t VALUES (3, 0)")  # the last transaction is in domain 0
    first = await read_n(src, 3)
    await src.close()
    assert [e.after["id"] for e in first if e.after] == [1, 2, 3]
    cp = first[-1].checkpoint
    assert {g.split("-")[0] for g in cp.gtid.split(",")} == {"0", "7"}  # both domains named
    again = source(mariadb, [f"{db}.t"])
    await again.open(again.load_position(cp.to_doc()))
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET SESSION gtid_domain_id = 7")
        cur.execute(f"INSERT INTO {db}.t VALUES (4, 7)")
    rest = await read_n(again, 1)
    more = [e for e in await again.read() if e.op != "h"]
    await again.close()
    assert [e.after["id"] for e in rest + more if e.after] == [4]  # nothing of domain 7 again


def _xa_prepare(server: MariaDB, db: str, xid: str, ids: list[int]) -> None:
    """XA START ... XA PREPARE on a connection that then goes away (the transaction stays prepared)."""
    with server.root(db) as c, c.cursor() as cur:
        cur.execute(f"XA START '{xid}'")
        for i in ids:
            cur.execute(f"INSERT INTO {db}.t VALUES ({i})")
        cur.execute(f"XA END '{xid}'")
        cur.execute(f"XA PREPARE '{xid}'")


async def test_xa_transactions_are_delivered_at_commit_in_commit_order_and_rollbacks_never(
    mariadb: MariaDB,
) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    _xa_prepare(mariadb, db, "x1", [1, 2])
    _xa_prepare(mariadb, db, "x2", [3])
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (10)")  # commits before x1 does
        cur.execute("XA ROLLBACK 'x2'")
        cur.execute("XA COMMIT 'x1'")
        cur.execute("XA START 'x3'")
        cur.execute(f"INSERT INTO {db}.t VALUES (20)")
        cur.execute("XA END 'x3'")
        cur.execute("XA COMMIT 'x3' ONE PHASE")
    events = await read_n(src, 4)
    await src.close()
    assert [e.after["id"] for e in events if e.after] == [10, 1, 2, 20]  # commit order; x2 never
    assert [e.tx_end for e in events] == [True, False, True, True]
    orders = [e.order for e in events]
    assert orders == sorted(orders)  # x1's rows sort after what committed before it


async def test_a_restart_while_an_xa_transaction_is_prepared_still_delivers_it(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    _xa_prepare(mariadb, db, "x9", [1])
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (2)")
    [two] = await read_n(src, 1)
    await src.close()  # checkpointed while x9 is prepared, then a restart
    again = source(mariadb, [f"{db}.t"])
    await again.open(again.load_position(two.checkpoint.to_doc()))
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("XA COMMIT 'x9'")
    got = await read_n(again, 2)
    await again.close()
    done = two.order
    assert [e.after["id"] for e in got if e.after and e.order > done] == [1]  # x9's row, after the restart


async def test_a_checkpoint_inside_a_transaction_resumes_with_the_rest_of_it(mariadb: MariaDB) -> None:
    """respect_source_tx: false may checkpoint inside a transaction (even inside one rows event):
    resuming there must bring rows k+1..n again. MariaDB resumes by the last committed GTID, so
    the whole transaction is read again and sinks skip what they hold by order."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            f"INSERT INTO {db}.t VALUES " + ", ".join(f"({i})" for i in range(1, 11))
        )  # one rows event
    first = await read_n(src, 10)
    await src.close()
    cut = first[3]
    assert not cut.tx_end
    again = source(mariadb, [f"{db}.t"])
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = await read_n(again, 10)
    await again.close()
    assert [e.after["id"] for e in rest if e.after and e.order > cut.order] == [5, 6, 7, 8, 9, 10]


async def test_a_checkpoint_inside_a_transaction_resumes_with_the_rest_of_it_by_file_position(
    mariadb: MariaDB,
) -> None:
    """The same by binlog file and position (MySQL's way, here on MariaDB with resume_by: file):
    the resume starts where the transaction began, not after the rows event the checkpoint is in,
    so rows k+1..n of that event and the transaction's later events come again."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.t"], resume_by="file")
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        c.begin()
        cur.execute(
            f"INSERT INTO {db}.t VALUES " + ", ".join(f"({i})" for i in range(1, 11))
        )  # one rows event
        cur.execute(f"INSERT INTO {db}.t VALUES (11), (12)")  # and another
        c.commit()
        cur.execute(f"INSERT INTO {db}.t VALUES (13)")  # the next transaction
    first = await read_n(src, 13)
    await src.close()
    cut = first[3]
    assert not cut.tx_end and cut.checkpoint.to_doc()["tx_start"]
    again = source(mariadb, [f"{db}.t"], resume_by="file")
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = await read_n(again, 13)
    await again.close()
    assert [e.after["id"] for e in rest if e.after and e.order > cut.order] == list(range(5, 14))


async def test_an_empty_varbinary_is_empty_bytes_not_text(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, vb VARBINARY(10))")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (1, x''), (2, x'00ff')")
    events = await read_n(src, 2)
    await src.close()
    assert [e.after for e in events] == [{"id": 1, "vb": b""}, {"id": 2, "vb": b"\x00\xff"}]


async def test_a_resume_from_before_added_and_dropped_columns_decodes_each_row_with_its_columns(
    mariadb: MariaDB,
) -> None:
    """Issue 15 item 7: the binlog's own column metadata decodes each row as it was written, also
    when a restart resumes from a checkpoint taken before the DDL."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1, 1)")
        cur.execute("ALTER TABLE t ADD COLUMN extra VARCHAR(10)")
        cur.execute("INSERT INTO t VALUES (2, 2, 'new')")
        cur.execute("ALTER TABLE t DROP COLUMN v")
        cur.execute("INSERT INTO t VALUES (3, 'only')")
    first = await read_n(src, 3)
    await src.close()
    assert [e.after for e in first] == [
        {"id": 1, "v": 1},
        {"id": 2, "v": 2, "extra": "new"},
        {"id": 3, "extra": "only"},
    ]
    again = source(mariadb, [f"{db}.t"])
    await again.open(again.load_position(first[0].checkpoint.to_doc()))  # before both DDLs
    rest = await read_n(again, 2)
    await again.close()
    assert [e.after for e in rest] == [{"id": 2, "v": 2, "extra": "new"}, {"id": 3, "extra": "only"}]


def _status(cur: Any, name: str) -> int:
    cur.execute(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return int(cur.fetchone()[1])


@pytest.fixture
def tls_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key, as MariaDB takes them."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


async def test_a_server_offering_tls_is_read_over_tls_with_one_shared_context(
    tls_pair: tuple[Path, Path],
) -> None:
    """No TLS settings means pymysql's PREFERRED mode — TLS whenever the server offers it — for
    the checks and the decoder child's connections alike; the context is built once per process,
    not once per connection with the system CA bundle loaded (``connection.py``)."""
    key, cert = tls_pair
    with MariaDB(extra_args=[f"--ssl-cert={cert}", f"--ssl-key={key}"]) as server:
        db = fresh_db(server)
        with server.root(db) as c, c.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        settings = MySQLSettings.from_dsn(server.dsn())
        with settings.connect() as mon, settings.connect() as other, mon.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1], "the connection is not encrypted"
            assert mon.ctx is other.ctx
            connections, handshakes = _status(cur, "Connections"), _status(cur, "Ssl_accepts")
            src = source(server, [f"{db}.t"])
            await src.open(None)
            with server.root(db) as c, c.cursor() as ins:
                ins.execute("INSERT INTO t VALUES (1)")
            events = await read_n(src, 1)
            await src.close()
            opened = _status(cur, "Connections") - connections
            assert [e.after for e in events] == [{"id": 1}]
            assert opened >= 4  # the checks', the decoder's control and stream connections, the INSERT's
            assert _status(cur, "Ssl_accepts") - handshakes == opened  # every one of them over TLS


async def test_a_sinks_skipped_count_is_events_it_held_not_heartbeats(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    """``skipped`` counts events a sink already held; the heartbeats that transactions on
    uncaptured tables send down the pipeline (to move checkpoints) are no events of the sink's
    and were counted as skipped."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE noise (id INT PRIMARY KEY AUTO_INCREMENT)")
    runner = to_file(mariadb, "beats", f"{db}.t", tmp_path / "out.jsonl", MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1)")
        await wait_until(lambda: runner.ctx.stats.events_committed >= 1, timeout=30, what="the first event")
        first = runner.ctx.stats.last_checkpoint

        def noise_moved_the_checkpoint() -> bool:  # a heartbeat went down the pipeline
            cur.execute("INSERT INTO noise VALUES ()")
            return runner.ctx.stats.last_checkpoint != first

        await wait_until(noise_moved_the_checkpoint, timeout=30, what="a heartbeat's checkpoint")
        cur.execute("INSERT INTO t VALUES (2)")
    await wait_until(lambda: runner.ctx.stats.events_committed >= 2, timeout=30, what="2 events")
    await runner.drain()
    await task
    stats = runner.ctx.stats.sinks["f"]
    assert (stats.events, stats.skipped) == (2, 0)


async def test_a_half_open_network_is_unavailable_not_a_silent_stall(
    mariadb: MariaDB, proxies: ProxyServer
) -> None:
    """The network stops passing anything and closes nothing (a dead route, a firewall dropping
    packets): with no read timeout, the stream waited forever on a socket that would never speak
    again, the pipeline saying ok, and a reconnect hung in its handshake the same way. The stream
    misses the server's heartbeats (every 50 ms) and reports the server unavailable after
    ``STALL_S``; a short connection's query gives up after its timeout."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    proxy = proxies.proxy("my", f"127.0.0.1:{mariadb.port}")
    dsn = mariadb.dsn().replace(f":{mariadb.port}/", f":{port_of(proxy)}/")
    src = MySQLSource(MySQLSourceConfig(id="my", dsn=dsn, tables=[f"{db}.t"]), tenant="acme")
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1)")
    await read_n(src, 1)
    for stream in ("downstream", "upstream"):
        proxy.add_toxic(name=f"hole_{stream}", type="timeout", stream=stream, attributes={"timeout": 0})
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(SourceUnavailable, match="timed out"):
        while loop.time() - began < 60:
            await src.read()
    await src.close()
    src.settings = dataclasses.replace(src.settings, query_timeout_s=2.0)
    with pytest.raises(SourceUnavailable, match="timed out"):
        await asyncio.wait_for(src.identity(), 60)


async def test_a_lost_stream_connection_reopens_from_the_checkpoint_not_replaying_the_session(
    mariadb: MariaDB,
) -> None:
    """python-mysql-replication reconnects by itself when its connection drops (here: the dump
    thread is killed on the server), from the GTID it was started at: every transaction of the
    session came again, and after a failover it would reconnect to another server unreconciled.
    The loss is reported instead (unavailable), and the source reopened from its checkpoint
    reads only what came after it."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        for i in range(1, 6):
            cur.execute("INSERT INTO t VALUES (%s)", (i,))
    first = await read_n(src, 5)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%%'")
        for (thread,) in cur.fetchall():
            cur.execute(f"KILL {int(thread)}")
        for i in range(6, 11):
            cur.execute(f"INSERT INTO {db}.t VALUES (%s)", (i,))
    with pytest.raises(SourceUnavailable, match="Lost connection"):
        await read_n(src, 100)
    await src.close()
    again = source(mariadb, [f"{db}.t"])
    await again.open(first[-1].checkpoint)
    assert [e.after["id"] for e in await read_n(again, 5) if e.after] == [6, 7, 8, 9, 10]
    await again.close()
