"""The Turso source against a real embedded Turso database (pyturso)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import turso
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import PositionLost, SourceMisconfigured
from deltaforge.sources.turso.config import TursoSourceConfig
from deltaforge.sources.turso.record import decode_record
from deltaforge.sources.turso.source import TursoSource
from tests.helpers import one_transaction_in_pieces, wait_until
from tests.kit import doc


def writer(path: Path) -> Any:
    conn = turso.connect(str(path))
    conn.execute("PRAGMA unstable_capture_data_changes_conn('full')")
    return conn


def written(db: Path, *statements: str) -> Any:
    """A writer on ``db`` that has run ``statements``, each committed on its own."""
    w = writer(db)
    for sql in statements:
        w.execute(sql)
        w.commit()
    return w


def source(path: Path, **extra: Any) -> TursoSource:
    return TursoSource(TursoSourceConfig(id="t", path=str(path), **extra), tenant="acme")


async def read_all(src: TursoSource) -> list[Event]:
    out: list[Event] = []
    while chunk := await src.read():
        out.extend(chunk)
    return out


def test_record_decoder_agrees_with_turso_json(tmp_path: Path) -> None:
    rng = random.Random(5)
    conn = writer(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT, d INTEGER)")
    for _ in range(300):
        conn.execute(
            "INSERT INTO t (a, b, c, d) VALUES (?, ?, ?, ?)",
            (
                rng.choice([0, 1, -1, 127, -129, 2**15, 2**23 + 1, -(2**31), 2**40, -(2**47), 2**62, None]),
                rng.choice([0.5, -1e300, 3.14159, None]),
                rng.choice(["", "héllo ✓", "x" * 300, None]),
                rng.randint(-(2**63), 2**63 - 1),
            ),
        )
    conn.commit()
    rows = conn.execute(
        "SELECT after, bin_record_json_object(table_columns_json_array('t'), after) FROM turso_cdc "
        "WHERE table_name = 't' ORDER BY change_id"
    ).fetchall()
    assert len(rows) == 300
    for blob, as_json in rows:
        expected = orjson.loads(as_json)
        got = dict(zip(["id", "a", "b", "c", "d"], decode_record(blob), strict=True))
        assert got == expected


async def test_inserts_updates_deletes_with_transactions_and_blobs(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    w = writer(db)
    w.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, name TEXT, amount REAL, raw BLOB)")
    w.execute("CREATE TABLE other (k TEXT PRIMARY KEY, v INTEGER)")
    w.commit()
    w.execute("INSERT INTO orders (name, amount, raw) VALUES ('a', 1.5, x'00ff')")
    w.commit()
    w.execute("INSERT INTO orders (name, amount) VALUES ('b', 2)")
    w.execute("UPDATE orders SET name = 'aa' WHERE id = 1")
    w.execute("INSERT INTO other VALUES ('k1', 7)")
    w.commit()
    w.execute("DELETE FROM orders WHERE id = 2")
    w.commit()

    src = source(db, read_chunk=3)  # small chunks: transactions span reads
    await src.open(None)
    events = await read_all(src)
    await src.close()
    assert [(e.op, e.table) for e in events] == [
        ("c", "orders"),
        ("c", "orders"),
        ("u", "orders"),
        ("c", "other"),
        ("d", "orders"),
    ]
    assert events[0].after == {"id": 1, "name": "a", "amount": 1.5, "raw": b"\x00\xff"}
    assert events[2].before == {"id": 1, "name": "a", "amount": 1.5, "raw": b"\x00\xff"}
    assert events[2].after is not None and events[2].after["name"] == "aa"
    assert events[3].after == {"k": "k1", "v": 7}
    assert events[4].before == {"id": 2, "name": "b", "amount": 2.0, "raw": None} and events[4].after is None
    # one transaction = one tx_id, tx_end only on its last event
    assert [e.tx_end for e in events] == [True, False, False, True, True]
    assert len({e.tx_id for e in events[1:4]}) == 1
    assert events[1].idempotency_key == f"acme|shop.orders|{events[1].tx_id}|{events[1].event_id}"
    orders = [e.order for e in events]
    assert orders == sorted(orders)


async def test_resume_after_checkpoint_and_table_filter(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    w = writer(db)
    w.execute("CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER)")
    w.execute("CREATE TABLE b (id INTEGER PRIMARY KEY, v INTEGER)")
    w.commit()
    for i in range(10):
        w.execute("INSERT INTO a (v) VALUES (?)", (i,))
        w.execute("INSERT INTO b (v) VALUES (?)", (i,))
        w.commit()
    src = source(db, tables=["a"])
    await src.open(None)
    first = await read_all(src)
    await src.close()
    assert [e.after["v"] for e in first if e.after] == list(range(10))
    assert {e.table for e in first} == {"a"}
    assert {e.source.key for e in first} == {("id",)}
    resume = first[4].checkpoint
    src2 = source(db, tables=["a"])
    await src2.open(resume)
    rest = await read_all(src2)
    await src2.close()
    assert [e.after["v"] for e in rest if e.after] == list(range(5, 10))
    # identical keys on replay
    assert [e.idempotency_key for e in rest] == [e.idempotency_key for e in first[5:]]


async def test_names_in_tables_no_table_has_are_named_at_every_start(tmp_path: Path) -> None:
    """A misspelt name in ``tables`` captured nothing while the pipeline ran as if all were well.
    Each start names the ones no table has; a table created later under such a name is captured."""
    db = tmp_path / "names.db"
    w = writer(db)
    w.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    w.commit()
    src = source(db, tables=["orders", "order"])
    with capture_logs() as logs:
        await src.open(None)
    assert [e["tables"] for e in logs if e["event"] == "captured_tables_not_found"] == [["order"]]
    w.execute('CREATE TABLE "order" (id INTEGER PRIMARY KEY)')
    w.execute('INSERT INTO "order" VALUES (7)')
    w.commit()
    assert [(e.table, e.after) for e in await read_all(src)] == [("order", {"id": 7})]
    await src.close()


async def test_added_column_appears_in_later_rows_only(tmp_path: Path) -> None:
    db = tmp_path / "ddl.db"
    w = written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)", "INSERT INTO t (v) VALUES (1)")
    src = source(db)
    await src.open(None)
    before = await read_all(src)
    w.execute("ALTER TABLE t ADD COLUMN extra TEXT")
    w.commit()
    w.execute("INSERT INTO t (v, extra) VALUES (2, 'new')")
    w.commit()
    after = await read_all(src)
    await src.close()
    assert before[0].after == {"id": 1, "v": 1}
    assert after[-1].after == {"id": 2, "v": 2, "extra": "new"}


async def test_pipeline_turso_to_file_with_debezium_envelope(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    w = writer(db)
    w.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT, score INTEGER)")
    w.commit()
    w.execute("INSERT INTO users (email, score) VALUES ('a@x', 1)")
    w.execute("INSERT INTO users (email, score) VALUES ('b@x', 2)")
    w.commit()
    w.execute("UPDATE users SET score = 5 WHERE id = 1")
    w.commit()
    w.execute("DELETE FROM users WHERE id = 2")
    w.commit()
    out = tmp_path / "events.jsonl"
    d = doc(
        sinks=[{"type": "file", "config": {"id": "f", "path": str(out), "envelope": {"type": "debezium"}}}],
        source_path=str(db),
        storage={"type": "sqlite", "path": str(tmp_path / "cp.db")},
    )
    runner = PipelineRunner(parse_pipeline(d, env={}))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 4, what="4 events committed")
    await runner.drain()
    await task
    docs = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [d["op"] for d in docs] == ["c", "c", "u", "d"]
    for doc_ in docs:
        # Debezium's value envelope: https://debezium.io/documentation/reference/connectors/
        assert set(doc_) >= {"before", "after", "source", "op", "ts_ms"}
        assert isinstance(doc_["ts_ms"], int)
        assert doc_["source"]["table"] == "users" and doc_["source"]["db"] == "app"
        assert doc_["source"]["connector"] == "turso" and isinstance(doc_["source"]["ts_ms"], int)
        if doc_["op"] == "c":
            assert doc_["before"] is None and isinstance(doc_["after"], dict)
        if doc_["op"] == "u":
            assert doc_["before"]["score"] == 1 and doc_["after"]["score"] == 5
        if doc_["op"] == "d":
            assert doc_["before"]["email"] == "b@x" and doc_["after"] is None


async def test_describe_tables_lists_the_user_tables_not_turso_internals(tmp_path: Path) -> None:
    conn = writer(tmp_path / "d.db")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, v REAL, b BLOB)")
    conn.execute("INSERT INTO t (name, v) VALUES ('a', 1.5)")
    conn.commit()
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()}
    assert {"turso_cdc", "turso_cdc_version"} <= names  # what CDC capture adds beside the user's tables
    [table] = await source(tmp_path / "d.db").describe_tables()
    assert (table.table, table.columns) == (
        "t",
        (("id", "INTEGER"), ("name", "TEXT"), ("v", "REAL"), ("b", "BLOB")),
    )
    only = await source(tmp_path / "d.db", tables=["nope"]).describe_tables()
    assert only == []


async def _checkpoint_after_three_transactions(db: Path) -> Any:
    w = writer(db)
    w.execute("CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER)")
    w.commit()
    for i in range(6):
        w.execute("INSERT INTO a (v) VALUES (?)", (i,))
        w.commit()
    w.close()
    src = source(db)
    await src.open(None)
    events = await read_all(src)
    await src.close()
    return events[2].checkpoint  # the third insert's transaction end


async def test_a_pruned_cdc_table_is_position_lost_not_a_silent_gap(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    cp = await _checkpoint_after_three_transactions(db)
    w = writer(db)
    w.execute("DELETE FROM turso_cdc WHERE change_id <= ?", (cp.change_id + 2,))
    w.commit()
    w.close()
    src = source(db)
    with pytest.raises(PositionLost) as info:
        await src.open(cp)
    await src.close()
    assert str(info.value).startswith(
        f"position lost: checkpoint change_id {cp.change_id} of source 't' is no longer in"
    )
    assert "pruned" in str(info.value) and str(info.value).endswith("Re-snapshot required.")


async def test_a_cdc_table_emptied_while_reading_is_position_lost_not_a_silent_skip(tmp_path: Path) -> None:
    """Turso keeps no AUTOINCREMENT sequence (probed, pyturso 0.8.3: ``sqlite_sequence`` stays
    empty), so once ``turso_cdc`` is emptied (its read rows deleted while the reader is caught up:
    the obvious clean-up) change ids start again at 1, below the reader's position, and the
    reader asked only for ids above it: every later change was skipped without a word until a
    restart found the position lost. Now the next read halts as position lost. Rows pruned while
    a newer one remains keep the ids going, and reading goes on."""
    db = tmp_path / "p.db"
    w = written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", "INSERT INTO t VALUES (1, 'a')")
    src = source(db)
    await src.open(None)
    assert [e.after["id"] for e in await read_all(src) if e.after] == [1]
    for sql in ("DELETE FROM turso_cdc WHERE change_id < (SELECT max(change_id) FROM turso_cdc)",
                "INSERT INTO t VALUES (2, 'b')"):  # fmt: skip
        w.execute(sql)
        w.commit()
    assert [e.after["id"] for e in await read_all(src) if e.after] == [2]
    for sql in ("DELETE FROM turso_cdc", "INSERT INTO t VALUES (3, 'c')"):
        w.execute(sql)
        w.commit()
    with pytest.raises(PositionLost) as lost:
        await read_all(src)
    await src.close()
    w.close()
    assert "change ids started again below the position" in str(lost.value)
    assert str(lost.value).endswith("Re-snapshot required.")


async def test_a_change_written_without_full_images_halts_saying_why_after_what_came_before(
    tmp_path: Path,
) -> None:
    """Turso captures per connection, in the mode that connection asked for. A delete written by
    one on ``'after'`` has no before image, so no key: delivered, it deleted nothing anywhere. The
    source now hands over the transactions before it, then stops naming the change and the mode to
    set; a restart from the last checkpoint stops at the same change."""
    db = tmp_path / "modes.db"
    full = writer(db)
    full.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    full.execute("INSERT INTO t VALUES (1, 'a')")
    full.commit()
    partial = turso.connect(str(db))
    partial.execute("PRAGMA unstable_capture_data_changes_conn('after')")
    partial.execute("DELETE FROM t WHERE id = 1")
    partial.commit()
    full.execute("INSERT INTO t VALUES (2, 'b')")
    full.commit()
    src = source(db)
    await src.open(None)
    first = await src.read()
    assert [(e.op, e.after) for e in first] == [("c", {"id": 1, "v": "a"})]
    with pytest.raises(SourceMisconfigured) as info:
        await src.read()
    await src.close()
    msg = str(info.value)
    assert "(delete on 't', transaction" in msg and "has no before image" in msg
    assert "PRAGMA unstable_capture_data_changes_conn('full')" in msg
    again = source(db)
    await again.open(first[-1].checkpoint)
    with pytest.raises(SourceMisconfigured, match="has no before image"):
        await again.read()
    await again.close()


async def test_a_change_without_full_images_inside_a_transaction_read_in_pieces_halts_once(
    tmp_path: Path,
) -> None:
    """The bad change ends a transaction larger than a read, whose first pieces were handed
    over as they were read: those pieces go out once, in order, and the source then stops at the
    change (it never reads the transaction again from its start, which would hand them over
    twice)."""
    db = tmp_path / "pieces.db"
    w = writer(db)
    w.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    w.execute("INSERT INTO t VALUES (0, 'z')")
    w.commit()
    w.execute("BEGIN")
    for i in range(1, 30):
        w.execute("INSERT INTO t VALUES (?, 'a')", (i,))
    w.execute("PRAGMA unstable_capture_data_changes_conn('after')")  # Turso takes it mid-transaction
    w.execute("DELETE FROM t WHERE id = 0")
    w.execute("COMMIT")
    src = source(db, read_chunk=10)
    await src.open(None)
    ids: list[int] = []
    with pytest.raises(SourceMisconfigured, match="has no before image"):
        for _ in range(20):
            ids += [e.after["id"] for e in await src.read() if e.after is not None]
    await src.close()
    assert ids == list(range(len(ids))) and len(ids) > 10, ids


def _replace_database(db: Path) -> None:
    """Another database at the same path: more changes, in other transactions."""
    for f in db.parent.glob(f"{db.name}*"):
        f.unlink()
    w = writer(db)
    w.execute("CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER)")
    w.execute("CREATE TABLE b (id INTEGER PRIMARY KEY, v INTEGER)")
    w.commit()
    for i in range(20):
        w.execute("INSERT INTO b (v) VALUES (?)", (i,))
    w.commit()
    w.close()


async def test_a_replaced_database_file_is_position_lost_even_when_it_has_more_changes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "p.db"
    cp = await _checkpoint_after_three_transactions(db)
    _replace_database(db)
    src = source(db)
    with pytest.raises(PositionLost, match="the database file was replaced"):
        await src.open(cp)
    await src.close()


async def test_a_checkpoint_stored_without_its_transaction_still_resumes(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    cp = await _checkpoint_after_three_transactions(db)
    old = TursoSource.load_position({"change_id": cp.change_id})  # as stored before txn/at existed
    src = source(db)
    await src.open(old)
    rest = await read_all(src)
    await src.close()
    assert [e.after["v"] for e in rest if e.after] == [3, 4, 5]


def test_text_that_is_not_utf8_is_kept_as_its_bytes_not_altered() -> None:
    """SQLite does not check that TEXT is UTF-8, and a file it wrote may hold such a value (Turso
    itself replaces invalid bytes with U+FFFD when writing, before anything reaches turso_cdc):
    the record decoder keeps those bytes rather than replacing them."""
    invalid = bytes([0x02, 2 * 2 + 13]) + b"\xffA"  # header: 2 bytes; one TEXT of 2 bytes
    valid = bytes([0x02, 2 * 6 + 13]) + "héllo".encode()
    assert decode_record(invalid) == [b"\xffA"]
    assert decode_record(valid) == ["héllo"]


async def test_rows_written_before_a_drop_column_decode_with_the_columns_they_had(tmp_path: Path) -> None:
    """A reader behind a DROP COLUMN must not shift old rows' values into the remaining names."""
    db = tmp_path / "s.db"
    w = writer(db)
    w.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c TEXT)")
    w.commit()
    w.execute("INSERT INTO t VALUES (1, 'bee', 'sea')")
    w.commit()
    w.execute("ALTER TABLE t DROP COLUMN b")
    w.commit()
    w.execute("INSERT INTO t VALUES (2, 'sea2')")
    w.execute("UPDATE t SET c = 'sea1' WHERE a = 1")
    w.commit()
    w.close()
    src = source(db)  # starts from the beginning: behind the DDL
    await src.open(None)
    events = await read_all(src)
    await src.close()
    assert [(e.op, e.before, e.after) for e in events] == [
        ("c", None, {"a": 1, "b": "bee", "c": "sea"}),  # as written, before the DROP COLUMN
        ("c", None, {"a": 2, "c": "sea2"}),
        ("u", {"a": 1, "c": "sea"}, {"a": 1, "c": "sea1"}),
    ]


async def test_a_primary_key_update_arrives_as_delete_and_insert_with_the_new_row(tmp_path: Path) -> None:
    """Turso logs ``UPDATE ... SET id = 9 WHERE id = 5`` as a delete and an insert whose new row it
    puts in the before column (pyturso 0.8.3); the insert must still carry the row as its after."""
    db = tmp_path / "k.db"
    w = writer(db)
    w.execute("CREATE TABLE a (id INTEGER PRIMARY KEY, v TEXT)")
    w.commit()
    w.execute("INSERT INTO a VALUES (5, 'x')")
    w.commit()
    w.execute("UPDATE a SET id = 9 WHERE id = 5")
    w.commit()
    w.close()
    src = source(db)
    await src.open(None)
    events = await read_all(src)
    await src.close()
    assert [(e.op, e.before, e.after) for e in events] == [
        ("c", None, {"id": 5, "v": "x"}),
        ("d", {"id": 5, "v": "x"}, None),
        ("c", None, {"id": 9, "v": "x"}),
    ]


async def test_a_large_transaction_is_handed_over_in_pieces_as_it_is_read(tmp_path: Path) -> None:
    """A transaction larger than a read goes on in pieces, not held until its commit marker is
    read; the pieces make one transaction, and a checkpoint inside it resumes with the rest."""
    db = tmp_path / "big.db"
    w = writer(db)
    w.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    w.commit()
    for i in range(1, 5001):
        w.execute("INSERT INTO t VALUES (?, ?)", (i, f"row {i}"))
    w.commit()
    w.execute("INSERT INTO t VALUES (0, 'after')")
    w.commit()
    src = source(db, read_chunk=500)
    await src.open(None)
    events = await one_transaction_in_pieces(src, 5000, 1)
    await src.close()
    assert [e.after["id"] for e in events if e.after] == [*range(1, 5001), 0]
    again = source(db)
    await again.open(again.load_position(events[2499].checkpoint.to_doc()))
    rest = await read_all(again)
    await again.close()
    assert [e.after["id"] for e in rest if e.after] == [*range(2501, 5001), 0] and rest[2499].tx_end


async def test_an_infinite_real_is_its_text_streamed_or_snapshotted_not_jsons_null(tmp_path: Path) -> None:
    """SQLite stores a REAL that overflows as an infinity; orjson wrote it as null, which a
    consumer cannot tell from NULL. It is ``"Infinity"``/``"-Infinity"`` now, in a change and in a
    snapshot row alike, as the PostgreSQL source gives a double's."""
    db = tmp_path / "inf.db"
    written(
        db, "CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL)",
        "INSERT INTO t VALUES (1, 1e999), (2, -1e999), (3, 2.5), (4, NULL)",
    )  # fmt: skip
    src = source(db)
    await src.open(None)
    streamed = [e.after for e in await read_all(src)]
    reader = src.chunk_reader(SnapshotSettings())
    await reader.open(1)
    (ref,) = await reader.tables(["t"])
    snapshotted, _, _ = await reader.chunk(ref, None, 10)
    await reader.close()
    await src.close()
    assert streamed == snapshotted == [
        {"id": 1, "r": "Infinity"}, {"id": 2, "r": "-Infinity"}, {"id": 3, "r": 2.5}, {"id": 4, "r": None}
    ]  # fmt: skip
    assert orjson.dumps(snapshotted[0]) == b'{"id":1,"r":"Infinity"}'


async def test_a_table_renamed_to_a_captured_name_decodes_with_its_own_columns(tmp_path: Path) -> None:
    """Turso logs no ALTER TABLE ... RENAME in turso_cdc: a table with more columns renamed to a
    captured name had its rows decoded with the replaced table's columns, the values past them
    dropped without a word ({'id': 8, 'a': 'b8'} for (8, 'b8', 'c8'))."""
    db = tmp_path / "r.db"
    w = writer(db)
    w.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, a TEXT)")
    w.execute("CREATE TABLE staging (id INTEGER PRIMARY KEY, b TEXT, c TEXT)")
    w.commit()
    src = source(db, tables=["items"])
    await src.open(None)
    w.execute("INSERT INTO items VALUES (1, 'one')")
    w.commit()
    assert [e.after for e in await read_all(src)] == [{"id": 1, "a": "one"}]
    for sql in ("ALTER TABLE items RENAME TO items_old", "ALTER TABLE staging RENAME TO items",
                "INSERT INTO items VALUES (8, 'b8', 'c8')"):  # fmt: skip
        w.execute(sql)
        w.commit()
    w.close()
    assert [e.after for e in await read_all(src)] == [{"id": 8, "b": "b8", "c": "c8"}]
    await src.close()


async def test_a_captured_table_dropped_is_named(tmp_path: Path) -> None:
    """``DROP TABLE`` logs no change for the rows it takes (probed, pyturso 0.8.3: only the
    ``sqlite_schema`` row's delete), so the sinks keep them; the MySQL/MariaDB and PostgreSQL
    sources name such a table, the Turso source said nothing. A table not captured is not named,
    nor is an index dropped."""
    db = tmp_path / "drop.db"
    w = written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", "CREATE TABLE other (id INTEGER PRIMARY KEY)",
                "CREATE INDEX t_v ON t (v)", "INSERT INTO t VALUES (1, 'a')")  # fmt: skip
    src = source(db, tables=["t"])
    await src.open(None)
    assert [e.after for e in await read_all(src)] == [{"id": 1, "v": "a"}]
    with capture_logs() as logs:
        for sql in ("DROP INDEX t_v", "DROP TABLE other", "DROP TABLE t", "CREATE TABLE t (id INTEGER PRIMARY KEY)",
                    "INSERT INTO t VALUES (2)"):  # fmt: skip
            w.execute(sql)
            w.commit()
        assert [e.after for e in await read_all(src)] == [{"id": 2}]
    await src.close()
    w.close()
    dropped = [e for e in logs if e["event"] == "captured_table_dropped"]
    assert [e["table"] for e in dropped] == ["t"]
    assert "stay in the sinks" in dropped[0]["reason"]


async def test_a_captured_table_renamed_out_of_tables_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ALTER TABLE t RENAME TO t_old`` logs nothing in ``turso_cdc`` (probed, pyturso 0.8.3), and
    capture goes by name: every later change of the table was left out without a word. The
    source now looks at the captured tables' names every few seconds (here at every read): a
    renamed one is named with its new name (``captured_table_renamed``), once."""
    from deltaforge.sources.turso.captured import CapturedNames

    monkeypatch.setattr(CapturedNames, "every_s", 0.0)
    db = tmp_path / "rename.db"
    w = written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", "CREATE TABLE other (id INTEGER PRIMARY KEY)",
                "INSERT INTO t VALUES (1, 'a')")  # fmt: skip
    src = source(db, tables=["t"])
    await src.open(None)
    got = [e.after for _ in range(3) for e in await src.read()]  # the rows written before it
    assert got == [{"id": 1, "v": "a"}]
    with capture_logs() as logs:
        for sql in (
            "ALTER TABLE other RENAME TO other2",
            "ALTER TABLE t RENAME TO t_old",
            "INSERT INTO t_old VALUES (2, 'b')",
        ):
            w.execute(sql)
            w.commit()
        for _ in range(3):
            await src.read()
    await src.close()
    w.close()
    assert [(e["table"], e["to"]) for e in logs if e["event"] == "captured_table_renamed"] == [("t", "t_old")]


async def test_a_database_another_process_holds_is_waited_for_not_a_failure(tmp_path: Path) -> None:
    """pyturso locks a database file per process: while the application writing it runs in a
    process of its own, deltaforge cannot open it. That is the file unavailable, said and waited
    for (``degraded``), and read once the other process lets go. Before, each opening failed as
    a crash, and the pipeline failed once its restarts ran out."""
    db = tmp_path / "app.db"
    written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY)", "INSERT INTO t VALUES (1)").close()
    holder = hold(db)
    try:
        d = doc(name="app", source_path=str(db), storage={"type": "memory"},
                supervision={"max_restarts": 3, "within_seconds": 60, "backoff": {"base_ms": 50, "max_ms": 200}})  # fmt: skip
        runner = PipelineRunner(parse_pipeline(d, env={}))
        task = asyncio.create_task(runner.run())

        def said() -> str:
            return str(runner.ctx.availability.view().get("source", {}).get("last_error", ""))

        await wait_until(lambda: "locked by another process" in said() or runner.state == "failed", timeout=30,
                         what="the source listed unavailable")  # fmt: skip
        assert runner.state == "running", runner.failure
        assert "the application writing it" in said(), said()
        holder.kill()
        holder.wait(10)
        await wait_until(lambda: runner.ctx.stats.events_committed >= 1, timeout=30, what="the row delivered")
        assert not runner.ctx.availability.degraded
        runner.stop_now()
        await asyncio.wait_for(task, 30)
    finally:
        holder.kill()
        holder.wait(10)


async def test_a_database_path_naming_a_folder_stops_the_pipeline_at_once_saying_so(tmp_path: Path) -> None:
    """No wait and no restart makes a folder a database file, so the pipeline fails at once
    saying what to change, as a file sink given a folder does. Before, pyturso's
    ``open: IsADirectory`` crashed the reader, and each restart asked again until the restart
    intensity ran out, ``/health`` ok meanwhile."""
    db = tmp_path / "app.db"
    db.mkdir()
    d = doc(name="app", source_path=str(db), storage={"type": "memory"},
            supervision={"max_restarts": 3, "within_seconds": 60, "backoff": {"base_ms": 50, "max_ms": 200}})  # fmt: skip
    runner = PipelineRunner(parse_pipeline(d, env={}))
    with capture_logs() as logs:
        await asyncio.wait_for(runner.run(), 30)
    assert runner.state == "failed"
    assert f"turso source 'src': {db} is a folder; path names the database file" in str(runner.failure)
    assert [e for e in logs if e["event"] == "child_restarted"] == []


def hold(db: Path) -> subprocess.Popen[str]:
    """Another process with ``db`` open (pyturso's lock held), once it has it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


HOLD = """
import sys, time, turso
conn = turso.connect(sys.argv[1])
conn.execute("SELECT 1").fetchall()
print("held", flush=True)
time.sleep(600)
"""
