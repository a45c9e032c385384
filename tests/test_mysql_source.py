"""The MySQL/MariaDB binlog source against a real private MariaDB: rows, types, resumes, schema changes."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
from collections.abc import MutableMapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
from structlog.testing import capture_logs

from deltaforge.events import Event
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.mysql_kit import fresh_db, opened_on, purge_before, read_n, source, to_file
from tests.servers.mariadb import MariaDB

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
    assert after["e"] == "green" and after["s"] == "a,c" and after["nul"] is None
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

    rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert rows[0]["after"] == {"id": 1, "v": 1}
    assert rows[1]["after"] == {"id": 2, "v": 2, "extra": "new"}
    assert rows[2]["before"] == {"id": 1, "v": 1, "extra": None} and rows[2]["after"]["extra"] == "x"
    history = await store.schema_history("my", f"{db}.t")
    assert [[c["name"] for c in h["columns"]] for h in history] == [["id", "v"], ["id", "v", "extra"]]
    assert history[1]["position"]["pos"] > history[0]["position"]["pos"]
    assert history[1]["position"]["file"].startswith("mysql-bin.")


async def test_a_type_narrowed_within_its_type_code_is_named_as_retyped(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    """``decimal(6,2)`` to ``decimal(6,1)`` rounds every row without a row event, and both share a
    type code: the table map's precision and scale tell them apart. A new schema version, and
    ``columns_changed`` names the column; a wider varchar too, an unchanged table nothing."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, price DECIMAL(6,2), note VARCHAR(10))")
        cur.execute("INSERT INTO t VALUES (1, 1.25, 'a')")
        cur.execute("INSERT INTO t VALUES (2, 2.25, 'b')")  # the same table map: nothing new
        cur.execute("ALTER TABLE t MODIFY price DECIMAL(6,1), MODIFY note VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES (3, 3.5, 'c')")
    store = MemoryCheckpointStore()
    assert await column_changes(mariadb, db, tmp_path, store) == [(f"{db}.t", [], ["price", "note"])]
    assert len(await store.schema_history("my", f"{db}.t")) == 2


async def column_changes(
    mariadb: MariaDB, db: str, tmp_path: Path, store: MemoryCheckpointStore
) -> list[tuple[str, list[str], list[str]]]:
    """What ``columns_changed`` says while a pipeline reads the first three events of ``db``:
    ``(table, added, retyped)`` each time."""
    runner = to_file(mariadb, "ddl", f"{db}.*", tmp_path / "events.jsonl", store)
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed >= 3, timeout=30, what="3 events")
        await runner.drain()
        await task
    return [(e["table"], e["added"], e["retyped"]) for e in logs if e["event"] == "columns_changed"]


async def test_an_enum_or_set_that_lost_a_member_is_named_as_retyped(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    """An ENUM or SET whose list loses a member converts, without a row event, each row that held
    it (to ``''`` outside strict mode; and a renamed member is a lost one): the type code and the
    sizes stay, only the table map's member list tells. ``columns_changed`` names the column; a
    member added, which changes no row, is not named."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, m ENUM('a','b','c'), s SET('x','y'), n ENUM('p'))")
        cur.execute("INSERT INTO t VALUES (1, 'c', 'x,y', 'p')")
        cur.execute("ALTER TABLE t MODIFY n ENUM('p','q')")  # added: no row changes
        cur.execute("INSERT INTO t VALUES (2, 'a', 'x', 'q')")
        cur.execute("ALTER TABLE t MODIFY m ENUM('a','b','sea'), MODIFY s SET('x')")
        cur.execute("SELECT m, s FROM t WHERE id = 1")
        assert cur.fetchone() == ("", "x")  # what the sinks were never told
        cur.execute("INSERT INTO t VALUES (3, 'sea', 'x', 'q')")
    said = await column_changes(mariadb, db, tmp_path, MemoryCheckpointStore())
    assert said == [(f"{db}.t", [], ["m", "s"])]


async def test_timestamp_is_an_instant_in_utc_and_datetime_a_wall_clock(mariadb: MariaDB) -> None:
    """TIMESTAMP is stored as UTC and comes out aware, whatever the writer's time zone; DATETIME
    has no zone and stays naive, so the two are never confused."""
    db, src = await opened_on(mariadb, "id INT PRIMARY KEY, at TIMESTAMP(6) NULL, wall DATETIME(6)")
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
    db, src = await opened_on(mariadb, "id INT PRIMARY KEY, domain INT")
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


async def test_an_empty_varbinary_or_blob_is_empty_bytes_not_text(mariadb: MariaDB) -> None:
    """As a snapshot reads them (bytes, empty or not): streamed, an empty one came out as ""."""
    db, src = await opened_on(
        mariadb,
        "id INT PRIMARY KEY, vb VARBINARY(10), tb TINYBLOB, b BLOB, mb MEDIUMBLOB, lb LONGBLOB, tx TEXT",
    )
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            f"INSERT INTO {db}.t VALUES (1, x'', x'', x'', x'', x'', ''), (2, x'00ff', x'01', x'02', x'03', x'04', 'é')"
        )
    events = await read_n(src, 2)
    await src.close()
    assert [e.after for e in events] == [
        {"id": 1, "vb": b"", "tb": b"", "b": b"", "mb": b"", "lb": b"", "tx": ""},
        {"id": 2, "vb": b"\x00\xff", "tb": b"\x01", "b": b"\x02", "mb": b"\x03", "lb": b"\x04", "tx": "é"},
    ]


async def test_a_resume_from_before_added_and_dropped_columns_decodes_each_row_with_its_columns(
    mariadb: MariaDB,
) -> None:
    """Issue 15 item 7: the binlog's own column metadata decodes each row as it was written, also
    when a restart resumes from a checkpoint taken before the DDL."""
    db, src = await opened_on(mariadb, "id INT PRIMARY KEY, v INT")
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


async def test_a_reopening_without_a_checkpoint_reads_again_what_was_handed_out(mariadb: MariaDB) -> None:
    """As for PostgreSQL: a reopening of the same source object with no checkpoint (a restart
    before the first one was durable) starts where the first opening did, skipping nothing."""
    db, src = await opened_on(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        for i in (1, 2, 3):
            cur.execute("INSERT INTO t VALUES (%s)", (i,))
    assert [e.after["id"] for e in await read_n(src, 3) if e.after] == [1, 2, 3]
    await src.close()
    with mariadb.root(db) as c, c.cursor() as cur:
        for i in (4, 5):
            cur.execute("INSERT INTO t VALUES (%s)", (i,))
    await src.open(None)
    again = await read_n(src, 5)
    await src.close()
    assert [e.after["id"] for e in again if e.after] == [1, 2, 3, 4, 5]


async def test_a_reopening_from_now_without_a_checkpoint_starts_where_the_first_one_did(
    mariadb: MariaDB,
) -> None:
    """With a snapshot to come, an opening without a checkpoint reads from the newest change. A
    reopening (a reconnect before the first checkpoint was durable) must not take a newer
    "now": a delete in between would be lost, while its row may already be in a sink from the
    first opening's snapshot. After a lost position (``start_from`` cleared) it is now again."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1)")  # before the first opening: the snapshot's to copy
    src = source(mariadb, [f"{db}.t"])
    src.from_now = True
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (2)")
    assert [(e.op, (e.after or e.before or {})["id"]) for e in await read_n(src, 1)] == [("c", 2)]
    await src.close()
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("DELETE FROM t WHERE id = 1")
    await src.open(None)
    again = await read_n(src, 2)
    await src.close()
    assert [(e.op, (e.after or e.before or {})["id"]) for e in again] == [("c", 2), ("d", 1)]
    src.start_from = None
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (3)")
    fresh = await read_n(src, 1)
    await src.close()
    assert [(e.op, (e.after or e.before or {})["id"]) for e in fresh] == [("c", 3)]


async def test_values_a_partial_row_image_leaves_out_are_marked_never_false_nulls(mariadb: MariaDB) -> None:
    """A session may log with binlog_row_image MINIMAL or NOBLOB, whatever the server's setting:
    its updates carry only the key before and the changed columns after. python-mysql-replication
    gives the rest as None: an update of ``a`` was delivered with ``id`` and ``b`` NULL. An
    unchanged column now takes its value from the before image when that has it; anything else
    is marked ``{"__not_logged__": true}``, and the source says so, once per table."""
    db, src = await opened_on(mariadb, "id INT PRIMARY KEY, a INT, b TEXT")
    with capture_logs() as logs:  # said by the decoder's pump thread as soon as it meets it
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO {db}.t VALUES (1, 1, 'one'), (2, 2, 'two')")
            c.commit()
            cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
            cur.execute(f"UPDATE {db}.t SET a = 10 WHERE id = 1")
            cur.execute(f"DELETE FROM {db}.t WHERE id = 2")
            c.commit()
            cur.execute("SET SESSION binlog_row_image = 'NOBLOB'")
            cur.execute(f"UPDATE {db}.t SET a = 11 WHERE id = 1")
            c.commit()
        events = await read_n(src, 5)
    await src.close()
    gone = {"__not_logged__": True}
    minimal, deleted, noblob = events[2:]
    assert minimal.before == {"id": 1, "a": gone, "b": gone} and minimal.after == {
        "id": 1,
        "a": 10,
        "b": gone,
    }
    assert deleted.before == {"id": 2, "a": gone, "b": gone}
    assert noblob.before == {"id": 1, "a": 10, "b": gone} and noblob.after == {"id": 1, "a": 11, "b": gone}
    assert events[0].after == {"id": 1, "a": 1, "b": "one"}  # full images as they were
    [said] = [e for e in logs if e["event"] == "partial_row_image"]
    assert said["table"] == f"{db}.t" and said["columns"] == ["a", "b"]


async def ddl_logged(
    mariadb: MariaDB, tables: tuple[str, ...], captured: tuple[str, ...], *statements: str
) -> tuple[str, list[MutableMapping[str, Any]], Event]:
    """In a fresh database with ``tables`` (one ``id`` column each) and a source capturing
    ``captured``: the log of running ``statements``, then ``INSERT INTO t VALUES (1)``, and that
    insert's event (read once the reader has passed the statements)."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        for table in tables:
            cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.{t}" for t in captured])
    await src.open(None)
    # The decoder's pump thread says what it meets as soon as it meets it: capture from before.
    with capture_logs() as logs:
        with mariadb.root(db) as c, c.cursor() as cur:
            for sql in (*statements, "INSERT INTO t VALUES (1)"):
                cur.execute(sql)
        [ev] = await read_n(src, 1)
    await src.close()
    return db, logs, ev


async def test_a_captured_table_renamed_or_dropped_out_of_tables_is_named(mariadb: MariaDB) -> None:
    """Capture goes by name: after ``RENAME TABLE orders TO orders_old`` the table's changes went
    on under a name outside ``tables``, and stopped arriving without a word; a dropped table's
    rows stay in every sink. Each is named when the reader passes the DDL; a rename that stays
    inside ``tables`` (a glob) is not."""
    db, logs, ev = await ddl_logged(
        mariadb, ("orders", "items", "log_1", "t"), ("orders", "items", "log_*", "t"),
        "RENAME TABLE orders TO orders_old, log_1 TO log_2", "DROP TABLE items",
    )  # fmt: skip
    said = [(e["event"], e["table"], e["to"]) for e in logs if e["event"].startswith("captured_table_")]
    assert said == [
        ("captured_table_renamed", f"{db}.orders", f"{db}.orders_old"),
        ("captured_table_dropped", f"{db}.items", None),
    ]
    assert ev.after == {"id": 1}


async def test_a_table_renamed_into_tables_is_named(mariadb: MariaDB) -> None:
    """``RENAME TABLE orders TO orders_old, staging TO orders`` puts staging's rows under a
    captured name with no change event for any of them: the sinks kept the old table's rows
    without a word. The table renamed in is named, with the one it came from."""
    db, logs, ev = await ddl_logged(
        mariadb, ("orders", "staging", "t"), ("orders", "t"),
        "INSERT INTO staging VALUES (7)", "RENAME TABLE orders TO orders_old, staging TO orders",
    )  # fmt: skip
    said = [(e["event"], e["table"]) for e in logs if e["event"].startswith("captured_table_")]
    assert said == [("captured_table_renamed", f"{db}.orders"), ("captured_table_renamed_in", f"{db}.orders")]
    [came] = [e for e in logs if e["event"] == "captured_table_renamed_in"]
    assert (
        came["renamed_from"] == f"{db}.staging"
        and f"deltaforge snapshot <pipeline> {db}.orders" in came["reason"]
    )
    assert ev.after == {"id": 1}


async def test_rows_changed_by_partition_maintenance_are_named(mariadb: MariaDB) -> None:
    """``ALTER TABLE … DROP PARTITION`` (how old rows are retired), ``TRUNCATE PARTITION``,
    ``EXCHANGE PARTITION … WITH TABLE`` and MariaDB's ``CONVERT PARTITION … TO TABLE`` change rows
    without a row event for any of them: the sinks kept the old rows without a word. Each is named
    for every captured table it changes (both sides of an exchange) as the reader passes it;
    maintenance that keeps the rows (``REORGANIZE``) is not."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            "CREATE TABLE t (id INT PRIMARY KEY) PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (10), "
            "PARTITION p1 VALUES LESS THAN (20), PARTITION p2 VALUES LESS THAN (30), PARTITION p3 VALUES LESS THAN (40))"
        )
        cur.execute("CREATE TABLE x (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1), (11), (21), (31)")
    src = source(mariadb, [f"{db}.t", f"{db}.x"])
    await src.open(None)
    assert len(await read_n(src, 4)) == 4
    with capture_logs() as logs:  # said by the decoder's pump thread as soon as it meets them
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("ALTER TABLE t REORGANIZE PARTITION p3 INTO (PARTITION p3a VALUES LESS THAN (35), "
                        "PARTITION p3b VALUES LESS THAN (40))")  # fmt: skip
            cur.execute("ALTER TABLE t TRUNCATE PARTITION p1")
            cur.execute("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE x")
            cur.execute("ALTER TABLE t DROP PARTITION p2")
            cur.execute("ALTER TABLE t CONVERT PARTITION p3a TO TABLE u")
            cur.execute("INSERT INTO u VALUES (2)")  # the new table: not captured
            cur.execute("INSERT INTO x VALUES (5)")
        [ev] = await read_n(src, 1)
    await src.close()
    said = [(e["table"], e["statement"]) for e in logs if e["event"] == "captured_rows_changed_by_ddl"]
    assert said == [
        (f"{db}.t", "TRUNCATE PARTITION"),
        (f"{db}.t", "EXCHANGE PARTITION"),
        (f"{db}.x", "EXCHANGE PARTITION"),
        (f"{db}.t", "DROP PARTITION"),
        (f"{db}.t", "CONVERT PARTITION"),
    ]
    assert all(e["at"].startswith("mysql-bin.") for e in logs if e["event"] == "captured_rows_changed_by_ddl")
    assert (ev.table, ev.after) == ("x", {"id": 5})


async def test_a_tablespace_discarded_and_imported_under_a_captured_table_is_named(mariadb: MariaDB) -> None:
    """A transportable tablespace (``DISCARD TABLESPACE``, the files copied in, ``IMPORT
    TABLESPACE``) replaces a table's rows without a row event: the sinks kept the old ones without
    a word. Both statements are named as the reader passes them."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE other (id INT PRIMARY KEY)")  # not captured: where the new rows come from
        cur.execute("INSERT INTO t VALUES (1)")
        cur.execute("INSERT INTO other VALUES (7), (8)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    assert len(await read_n(src, 1)) == 1
    files = mariadb.data / db
    with capture_logs() as logs:  # said by the decoder's pump thread as soon as it meets them
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("FLUSH TABLES other FOR EXPORT")
            for ext in ("ibd", "cfg"):
                shutil.copyfile(files / f"other.{ext}", files / f"exported.{ext}")
            cur.execute("UNLOCK TABLES")
            cur.execute("ALTER TABLE t DISCARD TABLESPACE")
            for ext in ("ibd", "cfg"):
                (files / f"exported.{ext}").rename(files / f"t.{ext}")
            cur.execute("ALTER TABLE t IMPORT TABLESPACE")
            cur.execute("SELECT id FROM t ORDER BY id")
            assert [r[0] for r in cur.fetchall()] == [7, 8]  # the rows changed, no change was logged
            cur.execute("INSERT INTO t VALUES (9)")
        [ev] = await read_n(src, 1)
    await src.close()
    said = [(e["table"], e["statement"]) for e in logs if e["event"] == "captured_rows_changed_by_ddl"]
    assert said == [(f"{db}.t", "DISCARD TABLESPACE"), (f"{db}.t", "IMPORT TABLESPACE")]
    assert ev.after == {"id": 9}


async def test_changes_read_with_a_primary_key_change_keep_the_key_they_were_written_with(
    mariadb: MariaDB,
) -> None:
    """A change's key columns (``SourceInfo.key``: the Kafka record key, the PostgreSQL target's
    conflict key) are the table's primary key when the change was written, also when a backlog
    brings the changes before an ALTER that moves the key, and the ALTER, in one read: the decoder
    hands the earlier transactions on before the table's new columns, not after them."""
    db, src = await opened_on(mariadb, "id INT PRIMARY KEY, t VARCHAR(10) NOT NULL")
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (0, 'z')")
    [mark] = await read_n(src, 1)
    await src.close()
    with mariadb.root(db) as c, c.cursor() as cur:
        c.begin()
        cur.executemany("INSERT INTO t VALUES (%s, 'a')", [(i,) for i in range(1, 4)])
        c.commit()
        cur.execute("UPDATE t SET t = 'b' WHERE id = 1")
        cur.execute("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, t)")
        cur.execute("INSERT INTO t VALUES (4, 'c')")
        cur.execute("UPDATE t SET t = 'd' WHERE id = 2")
    again = source(mariadb, [f"{db}.t"])
    await again.open(mark.checkpoint)  # all of it a backlog, read at once
    events = await read_n(again, 6)
    await again.close()
    assert [(e.op, e.after["id"] if e.after else None, e.source.key) for e in events] == [
        ("c", 1, ("id",)),
        ("c", 2, ("id",)),
        ("c", 3, ("id",)),
        ("u", 1, ("id",)),
        ("c", 4, ("id", "t")),
        ("u", 2, ("id", "t")),
    ]


async def test_a_key_on_a_column_prefix_is_the_events_key_in_the_keys_order(mariadb: MariaDB) -> None:
    """With a prefix on a key column the table map lists the key apart (PRIMARY_KEY_WITH_PREFIX),
    and the library marks no column as in it: the key is still known, in the key's order."""
    db, src = await opened_on(mariadb, "id INT, code VARCHAR(40), v INT, PRIMARY KEY (code(4), id)")
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1, 'abcdef', 1)")
    [ev] = await read_n(src, 1)
    await src.close()
    assert ev.source.key == ("code", "id")


async def test_a_partial_row_image_marks_timestamp_set_and_float_columns_too(mariadb: MariaDB) -> None:
    """The columns a MINIMAL image leaves out are marked before the decoder sets values right
    (TIMESTAMP's zone, SET's text, FLOAT's digits): a mark is left as it is. A TIMESTAMP column
    left out made the decoder call ``replace`` on the mark, and the child failed."""
    db, src = await opened_on(
        mariadb, "id INT PRIMARY KEY, a INT, ts TIMESTAMP NULL, s SET('x','y'), f FLOAT"
    )
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (1, 1, '2024-01-02 03:04:05', 'y,x', 1.1)")
        c.commit()
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute(f"UPDATE {db}.t SET a = 10 WHERE id = 1")
        c.commit()
    full, minimal = await read_n(src, 2)
    await src.close()
    gone = {"__not_logged__": True}
    assert full.after == {
        "id": 1,
        "a": 1,
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "s": "x,y",
        "f": 1.1,
    }
    assert minimal.before == {"id": 1, "a": gone, "ts": gone, "s": gone, "f": gone}
    assert minimal.after == {"id": 1, "a": 10, "ts": gone, "s": gone, "f": gone}
