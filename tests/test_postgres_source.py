"""The PostgreSQL source against a real private PostgreSQL 15 (pgoutput over streaming
replication): rows, types, transactions, resumes, schema changes."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import asyncpg
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import jsonl, one_transaction_in_pieces, wait_until
from tests.postgres_kit import TYPES, fresh_db, opened_on, read_n, source
from tests.servers.postgres import Postgres


async def test_mixed_workload_in_commit_order_with_typed_values(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(TYPES)
    await conn.execute("CREATE TABLE other (id int PRIMARY KEY, v int)")
    await conn.execute("ALTER TABLE types REPLICA IDENTITY FULL")
    await conn.execute("ALTER TABLE other REPLICA IDENTITY FULL")
    src = source(postgres, db, tables=["public.types", "public.other"])
    await src.open(None)  # creates publication and slot
    await conn.execute(
        "INSERT INTO types VALUES (1, 9007199254740993, 12345678901234.123456, -2.5e100, 'héllo ✓ 😀', "
        "'\\x00ff10', true, '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.5+02', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, \"two\"]}', '{\"z\": null}', '{1,2,NULL}', "
        "'{\"a b\",c}', NULL)"
    )
    async with conn.transaction():  # multi-table transaction
        await conn.execute("UPDATE types SET txt = 'changed', nul = 7 WHERE id = 1")
        await conn.execute("INSERT INTO other VALUES (1, 1)")
    await conn.execute("DELETE FROM types WHERE id = 1")
    await conn.execute("TRUNCATE other")
    await conn.execute("INSERT INTO other VALUES (2, 2)")
    events = await read_n(src, 6)
    assert [(e.op, e.table) for e in events] == [
        ("c", "types"),
        ("u", "types"),
        ("c", "other"),
        ("d", "types"),
        ("t", "other"),
        ("c", "other"),
    ]
    a = events[0].after
    assert a is not None
    assert (
        a["big"] == 9007199254740993 and a["num"] == Decimal("12345678901234.123456") and a["fl"] == -2.5e100
    )
    assert a["txt"] == "héllo ✓ 😀" and a["raw"] == b"\x00\xff\x10" and a["ok"] is True
    assert a["d"] == dt.date(2024, 2, 29) and a["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert a["tstz"] == dt.datetime(2024, 5, 6, 5, 8, 9, 500000, tzinfo=dt.UTC)
    assert a["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert a["j"] == {"k": [1, "two"]} and a["jb"] == {"z": None}
    assert a["arr"] == [1, 2, None] and a["tags"] == ["a b", "c"] and a["nul"] is None
    upd = events[1]
    assert upd.before is not None and upd.before["txt"] == "héllo ✓ 😀"
    assert upd.after is not None and upd.after["txt"] == "changed" and upd.after["nul"] == 7
    assert [e.tx_end for e in events] == [True, False, True, True, True, True]
    assert events[1].tx_id == events[2].tx_id
    assert events[3].before is not None and events[3].before["id"] == 1 and events[3].after is None
    assert [e.order for e in events] == sorted(e.order for e in events)
    assert events[0].source.schema == "public" and events[0].source.db == db
    await src.close()
    await conn.close()


async def test_one_hundred_thousand_row_transaction_is_one_transaction(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, 100000) g")
    await conn.execute("INSERT INTO big VALUES (0, 'after')")
    events = await read_n(src, 100_001)
    big = events[:100_000]
    assert len({e.tx_id for e in big}) == 1
    assert [e.tx_end for e in big].count(True) == 1 and big[-1].tx_end
    assert [e.after["id"] for e in big if e.after] == list(range(1, 100_001))
    assert events[-1].after == {"id": 0, "v": "after"}
    await src.close()
    await conn.close()


async def test_a_large_transaction_is_handed_over_in_pieces_as_it_is_read(postgres: Postgres) -> None:
    """A transaction larger than a read is handed over in pieces as it is decoded, not held until
    its Commit: a 300k-row one took 590 MB held whole (decoder and pipeline), a million-row UPDATE
    gigabytes. The pieces make one transaction: one id, consecutive positions, one end."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    src = source(postgres, db, read_chunk=1000)
    await src.open(None)
    await conn.execute("INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, 30000) g")
    await conn.execute("INSERT INTO big VALUES (0, 'after')")
    events = await one_transaction_in_pieces(src, 30_000, 1)
    big = events[:30_000]
    assert [e.order for e in big] == [(big[0].order[0], i) for i in range(30_000)]
    assert [e.after["id"] for e in big if e.after] == list(range(1, 30_001))
    assert events[-1].after == {"id": 0, "v": "after"} and events[-1].tx_end
    await src.close()
    await conn.close()


async def test_columns_a_key_only_before_image_does_not_carry_are_marked_not_null(postgres: Postgres) -> None:
    """With REPLICA IDENTITY DEFAULT a delete (or an update of the key) sends the old key only,
    and pgoutput sends the other columns as null: a deleted row was delivered as having had
    ``v`` NULL. Those columns are marked not logged; REPLICA IDENTITY FULL gives them."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE k (id int PRIMARY KEY, v text)")
    await conn.execute("CREATE TABLE f (id int PRIMARY KEY, v text)")
    await conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")
    src = source(postgres, db)
    await src.open(None)
    for t in ("k", "f"):
        await conn.execute(f"INSERT INTO {t} VALUES (1, 'one'), (2, 'two')")
        await conn.execute(f"UPDATE {t} SET id = 3 WHERE id = 1")
        await conn.execute(f"DELETE FROM {t} WHERE id = 2")
    events = await read_n(src, 8)
    await src.close()
    await conn.close()
    gone = {"__not_logged__": True}
    assert [e.before for e in events[:4]] == [None, None, {"id": 1, "v": gone}, {"id": 2, "v": gone}]
    assert [e.before for e in events[4:]] == [None, None, {"id": 1, "v": "one"}, {"id": 2, "v": "two"}]


async def test_unchanged_toast_is_marked_not_null(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)")
    await conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO docs VALUES (1, repeat('x', 100000), 1)")
    await conn.execute("UPDATE docs SET n = 2 WHERE id = 1")
    events = await read_n(src, 2)
    assert events[1].after is not None
    assert events[1].after["body"] == {"__unchanged_toast__": True}
    assert events[1].after["n"] == 2
    await src.close()
    await conn.close()


async def test_dates_and_times_parse_whatever_the_database_datestyle(postgres: Postgres) -> None:
    """A database whose default DateStyle is not ISO (SQL, DMY; another time zone) still gives
    datetimes and dates, not text that merely looks like one; a date Python cannot hold (infinity,
    a year past 9999) is PostgreSQL's text."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(f"ALTER DATABASE {db} SET DateStyle = 'SQL, DMY'")
    await conn.execute(f"ALTER DATABASE {db} SET TimeZone = 'America/New_York'")
    await conn.execute(
        "CREATE TABLE t (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, far date, "
        "later date, later_ts timestamp, later_tz timestamptz)"
    )
    await conn.close()
    src = source(postgres, db)
    await src.open(None)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(
        "INSERT INTO t VALUES (1, '2024-02-29', '2024-01-02 03:04:05.25', '2024-05-06 07:08:09+00', 'infinity', "
        "'12000-01-31', '12000-01-31 01:02:03', '12000-01-31 01:02:03+00')"
    )
    await conn.close()
    [ev] = await read_n(src, 1)
    await src.close()
    assert ev.after == {
        "id": 1,
        "d": dt.date(2024, 2, 29),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 250000),
        "tz": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
        "far": "infinity",  # beyond Python's dates: PostgreSQL's own text, as documented
        # past 9999: PostgreSQL's text too (it halted the reader: Python's dates end there)
        "later": "12000-01-31",
        "later_ts": "12000-01-31 01:02:03",
        "later_tz": "12000-01-31 01:02:03+00",
    }


async def test_a_checkpoint_inside_a_transaction_resumes_with_the_rest_of_it(postgres: Postgres) -> None:
    """respect_source_tx: false may cut a batch (and so a checkpoint) inside a transaction: the
    rows after the cut must come again on resume, not the transaction be skipped whole."""
    db, src = await opened_on(postgres, "CREATE TABLE t (id int PRIMARY KEY)")
    conn = await asyncpg.connect(postgres.dsn(db))
    async with conn.transaction():
        for i in range(1, 11):
            await conn.execute("INSERT INTO t VALUES ($1)", i)
    await conn.close()
    first = await read_n(src, 10)
    await src.close()
    cut = first[3]  # the 4th of 10 rows: a checkpoint inside the transaction
    assert not cut.tx_end
    again = source(postgres, db)
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = await read_n(again, 10)
    await again.close()
    assert [e.after["id"] for e in rest if e.after and e.order > cut.order] == [5, 6, 7, 8, 9, 10]


async def test_events_carry_the_primary_key_under_default_and_full_replica_identity(
    postgres: Postgres,
) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE d (v text, a int, b int, PRIMARY KEY (b, a))")
    await conn.execute("CREATE TABLE f (v text, id int PRIMARY KEY)")
    await conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")  # pgoutput then flags every column
    await conn.close()
    src = source(postgres, db)
    await src.open(None)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("INSERT INTO d VALUES ('x', 1, 2)")
    await conn.execute("INSERT INTO f VALUES ('y', 3)")
    await conn.execute("DELETE FROM f WHERE id = 3")
    await conn.close()
    events = await read_n(src, 3)
    await src.close()
    assert [(e.table, e.source.key) for e in events] == [("d", ("b", "a")), ("f", ("id",)), ("f", ("id",))]


async def test_a_resume_from_before_added_and_dropped_columns_decodes_each_row_with_its_columns(
    postgres: Postgres,
) -> None:
    """Issue 15 item 7: rows before and after DDL keep their own columns, also when a restart
    resumes from a checkpoint taken before the DDL."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO t VALUES (1, 1)")
    await conn.execute("ALTER TABLE t ADD COLUMN extra text")
    await conn.execute("INSERT INTO t VALUES (2, 2, 'new')")
    await conn.execute("ALTER TABLE t DROP COLUMN v")
    await conn.execute("INSERT INTO t VALUES (3, 'only')")
    first = await read_n(src, 3)
    await src.close()
    assert [e.after for e in first] == [  # Relation messages drive added and dropped columns
        {"id": 1, "v": 1},
        {"id": 2, "v": 2, "extra": "new"},
        {"id": 3, "extra": "only"},
    ]
    again = source(postgres, db)
    await again.open(again.load_position(first[0].checkpoint.to_doc()))  # before both DDLs
    rest = await read_n(again, 2)
    await again.close()
    await conn.close()
    assert [e.after for e in rest] == [{"id": 2, "v": 2, "extra": "new"}, {"id": 3, "extra": "only"}]


async def _ddl_rig(
    postgres: Postgres, tmp_path: Path, create: str
) -> tuple[asyncpg.Connection, MemoryCheckpointStore, Callable[[int], Awaitable[None]]]:
    """A new database with the table ``create`` makes, its slot and publication, a store, and
    ``run_until(n)``: a pipeline on the table to a file, run until ``n`` more events are committed."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(create)
    config = {
        "id": "pg",
        "dsn": postgres.dsn(db),
        "tables": ["public.t"],
        "slot": f"s_{db}",
        "publication": f"p_{db}",
    }
    doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "ddl"}, "spec": {
        "source": {"type": "postgres", "config": config},
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "events.jsonl")}}],
    }}  # fmt: skip
    store = MemoryCheckpointStore()

    async def run_until(n: int) -> None:
        runner = PipelineRunner(parse_pipeline(doc, env={}), store=store)
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=30, what=f"{n} events")
        await runner.drain()
        await task

    slot = source(postgres, db, tables=["public.t"])
    await slot.open(None)  # the slot and publication exist from here on
    await slot.close()
    return conn, store, run_until


async def test_the_schema_history_gets_a_version_per_column_change_and_none_per_reconnect(
    postgres: Postgres, tmp_path: Path
) -> None:
    """Relation messages are recorded as versions of the table's schema, from the transaction they
    came with; the Relation messages a new session sends again add nothing."""
    conn, store, run_until = await _ddl_rig(postgres, tmp_path, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    await conn.execute("INSERT INTO t VALUES (1, 1)")
    await conn.execute("ALTER TABLE t ADD COLUMN extra text")
    await conn.execute("INSERT INTO t VALUES (2, 2, 'new')")
    await run_until(2)
    await conn.execute("ALTER TABLE t DROP COLUMN v")
    await conn.execute("INSERT INTO t VALUES (3, 'only')")
    await run_until(1)  # a new session: Relation messages for t again, one of them new
    await conn.execute("INSERT INTO t VALUES (4, 'more')")
    await run_until(1)
    await conn.close()
    history = await store.schema_history("pg", "public.t")
    assert [[c["name"] for c in h["columns"]] for h in history] == [
        ["id", "v"],
        ["id", "v", "extra"],
        ["id", "extra"],
    ]
    commits = [h["position"]["commit_lsn"] for h in history]
    assert commits == sorted(commits) and len(set(commits)) == 3
    assert [e["after"]["id"] for e in jsonl(tmp_path / "events.jsonl")] == [1, 2, 3, 4]


async def test_a_type_narrowed_within_its_type_is_named_as_retyped(
    postgres: Postgres, tmp_path: Path
) -> None:
    """``numeric(6,2)`` to ``numeric(6,1)`` rounds every row without a change event, and keeps the
    type's oid: its typmod, which the Relation message carries, tells the change. It is a new
    schema version, and ``columns_changed`` names the column."""
    conn, store, run_until = await _ddl_rig(
        postgres, tmp_path, "CREATE TABLE t (id int PRIMARY KEY, price numeric(6,2))"
    )
    await conn.execute("INSERT INTO t VALUES (1, 1.25)")
    await run_until(1)
    await conn.execute("ALTER TABLE t ALTER COLUMN price TYPE numeric(6,1)")
    await conn.execute("INSERT INTO t VALUES (2, 2.5)")
    with capture_logs() as logs:
        await run_until(1)
    await conn.close()
    history = await store.schema_history("pg", "public.t")
    assert [[(c["type"], c["mod"]) for c in h["columns"] if c["name"] == "price"] for h in history] == [
        [(1700, (6 << 16 | 2) + 4)],
        [(1700, (6 << 16 | 1) + 4)],
    ]
    said = [e for e in logs if e["event"] == "columns_changed"]
    assert [(e["table"], e["added"], e["retyped"]) for e in said] == [("public.t", [], ["price"])]


async def test_a_reopening_without_a_checkpoint_reads_again_what_was_handed_out(postgres: Postgres) -> None:
    """A reconnect before the first checkpoint (the whole pipeline restarted, so what was handed
    out is gone with it) must start at the slot again, not skip what the last opening handed out."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    src = source(postgres, db)
    await src.open(None)
    for i in (1, 2, 3):
        await conn.execute("INSERT INTO t VALUES ($1)", i)
    assert [e.after["id"] for e in await read_n(src, 3) if e.after] == [1, 2, 3]
    await src.close()
    for i in (4, 5):
        await conn.execute("INSERT INTO t VALUES ($1)", i)
    await conn.close()
    await src.open(None)  # the same source object, as the supervisor's restart reopens it
    again = await read_n(src, 5)
    await src.close()
    assert [e.after["id"] for e in again if e.after] == [1, 2, 3, 4, 5]


async def test_changes_read_with_a_primary_key_change_keep_the_key_they_were_written_with(
    postgres: Postgres,
) -> None:
    """A change's key columns (``SourceInfo.key``: the Kafka record key, the PostgreSQL target's
    conflict key) are the table's primary key when the change was written, also when the stream is
    read after the key moved: the catalog, read then, knows only the newest key."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, t text NOT NULL)")
    await conn.close()
    src = source(postgres, db)
    await src.open(None)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("INSERT INTO t VALUES (0, 'z')")
    [mark] = await read_n(src, 1)
    await src.close()
    async with conn.transaction():
        for i in range(1, 4):
            await conn.execute("INSERT INTO t VALUES ($1, 'a')", i)
    await conn.execute("UPDATE t SET t = 'b' WHERE id = 1")
    await conn.execute("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (t, id)")
    await conn.execute("INSERT INTO t VALUES (4, 'c')")
    await conn.execute("UPDATE t SET t = 'd' WHERE id = 2")
    await conn.close()
    again = source(postgres, db)
    await again.open(again.load_position(mark.checkpoint.to_doc()))  # all of it a backlog
    events = await read_n(again, 6)
    await again.close()
    assert [(e.op, e.after["id"] if e.after else None, e.source.key) for e in events] == [
        ("c", 1, ("id",)),
        ("c", 2, ("id",)),
        ("c", 3, ("id",)),
        ("u", 1, ("id",)),
        ("c", 4, ("t", "id")),
        ("u", 2, ("t", "id")),
    ]


async def test_a_replica_identity_leaving_out_the_primary_key_is_said(postgres: Postgres) -> None:
    """Under REPLICA IDENTITY USING INDEX on columns without the whole primary key, PostgreSQL logs
    a delete with the index's columns only: the delete's key cannot be known, and is said to be so
    (a table whose index holds the key says nothing)."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    for t in ("t", "fine"):
        await conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, code text NOT NULL, v int)")
    await conn.execute("CREATE UNIQUE INDEX t_code ON t (code)")
    await conn.execute("ALTER TABLE t REPLICA IDENTITY USING INDEX t_code")
    await conn.execute("CREATE UNIQUE INDEX fine_both ON fine (code, id)")
    await conn.execute("ALTER TABLE fine REPLICA IDENTITY USING INDEX fine_both")
    src = source(postgres, db)
    await src.open(None)
    with capture_logs() as logs:
        for t in ("t", "fine"):
            await conn.execute(f"INSERT INTO {t} VALUES (5, 'x', 1)")
            await conn.execute(f"DELETE FROM {t} WHERE id = 5")
        events = await read_n(src, 4)
    await src.close()
    await conn.close()
    said = [e for e in logs if e["event"] == "delete_key_not_logged"]
    assert [(e["table"], e["key"], e["identity"]) for e in said] == [("public.t", ["id"], ["code"])]
    assert "REPLICA IDENTITY DEFAULT" in said[0]["reason"]
    deleted = {e.table: e.before for e in events if e.op == "d"}
    assert deleted["t"] is not None and deleted["t"]["id"] == {"__not_logged__": True}
    assert deleted["fine"] is not None and deleted["fine"]["id"] == 5


async def test_a_json_document_a_double_cannot_hold_exactly_is_postgresqls_text(postgres: Postgres) -> None:
    """PostgreSQL keeps a document's numbers exactly (jsonb as numeric) and lets a json value hold
    a lone UTF-16 surrogate. orjson rounded a long number silently (``123456789012345678901234567890``
    to ``1.2345678901234568e+29``, ``1.000000000000000000001`` to ``1.0``) and refused a number
    past a double's range or a lone surrogate, which halted the reader for good. Such a document
    now arrives as PostgreSQL's own text; every other is read, as before."""
    db, src = await opened_on(postgres, "CREATE TABLE t (id int PRIMARY KEY, jb jsonb, j json)")
    docs = [
        (
            '{"a": [1, 2.5, "x"]}',
            '{"n": 18446744073709551615, "f": 0.1234567890123456, "s": "12345678901234567890"}',
        ),
        ('{"big": 123456789012345678901234567890}', '{"precise": 1.000000000000000000001}'),
        ("[1e400]", '"\\ud800"'),
        ('{"split": 12345678.123456789012}', "[-1e-400]"),
    ]
    conn = await asyncpg.connect(postgres.dsn(db))
    for i, (jb, j) in enumerate(docs):
        await conn.execute("INSERT INTO t VALUES ($1, $2::jsonb, $3::json)", i, jb, j)
    texts = await conn.fetch("SELECT jb::text, j::text FROM t ORDER BY id")
    await conn.close()
    events = await read_n(src, len(docs))
    await src.close()
    got = [(e.after["jb"], e.after["j"]) for e in events if e.after is not None]
    assert got[0] == (
        {"a": [1, 2.5, "x"]},
        {"n": 18446744073709551615, "f": 0.1234567890123456, "s": "12345678901234567890"},
    )
    assert got[1:] == [(r[0], r[1]) for r in texts[1:]]
    assert got[1][0] == '{"big": 123456789012345678901234567890}' and got[2][0].startswith("[1000000")
