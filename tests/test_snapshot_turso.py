"""Snapshots of an embedded Turso database that already has rows, while it is written."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import turso
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.turso.snapshot import TursoChunks
from deltaforge.sources.turso.source import TursoSource
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import jsonl, wait_until
from tests.kit import doc
from tests.servers.postgres import Postgres
from tests.snapshot_kit import Execute, Writer, check_handoff, snapshot_rows_in
from tests.test_postgres_sink import into_target, running
from tests.test_postgres_sink import rows as pg_rows
from tests.test_postgres_sink import target as pg_target
from tests.test_turso_source import written

ROWS = 20_000


def existing_rows(path: Path, rows: int) -> None:
    """Rows written without CDC capture: there before the pipeline, in no turso_cdc."""
    conn = turso.connect(str(path))
    conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, payload TEXT)")
    for start in range(1, rows + 1, 1000):
        conn.executemany(
            "INSERT INTO items VALUES (?, ?, 'x')",
            [(i, i) for i in range(start, min(start + 1000, rows + 1))],
        )
    conn.commit()
    conn.close()


def writer(path: Path, rows: int) -> Writer:
    def connect() -> tuple[Execute, Any]:
        conn = turso.connect(str(path))
        conn.execute("PRAGMA unstable_capture_data_changes_conn('full')")

        def execute(sql: str, args: tuple[Any, ...]) -> None:
            conn.execute(sql.replace("%s", "?"), args)
            conn.commit()

        return execute, conn.close

    return Writer(connect, rows, seed=5, rate=500)


def table_state(path: Path) -> dict[int, int]:
    conn = turso.connect(str(path))
    try:
        return {int(i): int(v) for i, v in conn.execute("SELECT id, v FROM items").fetchall()}
    finally:
        conn.close()


async def test_a_database_with_rows_is_snapshotted_while_written_and_hands_off_to_streaming(
    tmp_path: Path,
) -> None:
    db, out = tmp_path / "app.db", tmp_path / "events.jsonl"
    existing_rows(db, ROWS)
    d = doc(source_path=str(db), sinks=[{"type": "file", "config": {"id": "f", "path": str(out)}}],
            batch={"max_events": 1000, "max_ms": 20})  # fmt: skip
    d["spec"]["source"]["config"].update(
        {"tables": ["items"], "snapshot": {"mode": "initial", "chunk_size": 700}}
    )
    runner = PipelineRunner(parse_pipeline(d, env={}), store=MemoryCheckpointStore())
    work = writer(db, ROWS)
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: runner.ctx.snapshot.running, timeout=30, what="snapshot started")
        work.start()
        await wait_until(lambda: bool(runner.ctx.snapshot.finished), timeout=120, what="snapshot finished")
    finally:
        work.stop.set()
        await asyncio.to_thread(work.join, 10)
    assert work.error is None, work.error
    final = table_state(db)

    def caught_up() -> bool:
        from tests.helpers import jsonl
        from tests.snapshot_kit import replay

        return replay(jsonl(out)) == final

    await wait_until(caught_up, timeout=60, what="sink caught up")
    await runner.drain()
    await task
    assert min(work.ops.values()) > 0, work.ops
    check_handoff(out, final, crashes=False)
    assert snapshot_rows_in(out) >= ROWS - work.ops["delete"] - work.ops["move"] - work.ops["update"]


async def test_a_database_nobody_writes_is_snapshotted_whole(tmp_path: Path) -> None:
    """Every chunk is read at the same change (none is written): each window must still order
    after the one before, or a sink holding the first window's end skips the next one's rows."""
    db, out = tmp_path / "app.db", tmp_path / "events.jsonl"
    existing_rows(db, 1000)
    d = doc(source_path=str(db), sinks=[{"type": "file", "config": {"id": "f", "path": str(out)}}],
            batch={"max_events": 100, "max_ms": 20})  # fmt: skip
    d["spec"]["source"]["config"].update(
        {"tables": ["items"], "snapshot": {"mode": "initial", "chunk_size": 50}}
    )
    runner = PipelineRunner(parse_pipeline(d, env={}), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: bool(runner.ctx.snapshot.finished), timeout=60, what="snapshot finished")
    await runner.drain()
    await task
    check_handoff(out, table_state(db), crashes=False)
    assert snapshot_rows_in(out) == 1000  # each row once


async def test_a_table_growing_at_its_end_faster_than_it_is_read_still_finishes(tmp_path: Path) -> None:
    """As for MariaDB (tests/test_snapshot_mariadb.py): 15 captured rows added at the end for
    every 10 a chunk reads; the snapshot ends at the largest key it began with, the stream
    delivers the rest, and the sink ends equal to the table."""
    from tests.snapshot_kit import replay

    db, out = tmp_path / "app.db", tmp_path / "events.jsonl"
    existing_rows(db, 100)
    grow = turso.connect(str(db))
    grow.execute("PRAGMA unstable_capture_data_changes_conn('full')")
    added = 0

    class Growing(TursoChunks):
        def _chunk(self, table: Any, after: Any, limit: int) -> Any:
            nonlocal added
            got = super()._chunk(table, after, limit)
            grow.executemany(
                "INSERT INTO items VALUES (?, ?, 'new')", [(1000 + added + i, i) for i in range(1, 16)]
            )
            grow.commit()
            added += 15
            return got

    class Source(TursoSource):
        def chunk_reader(self, settings: Any) -> Any:
            return Growing(self)

    d = doc(source_path=str(db), sinks=[{"type": "file", "config": {"id": "f", "path": str(out)}}],
            batch={"max_events": 100, "max_ms": 20})  # fmt: skip
    d["spec"]["source"]["config"].update(
        {"tables": ["items"], "snapshot": {"mode": "initial", "chunk_size": 10}}
    )
    cfg = parse_pipeline(d, env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=Source(cfg.source.config, cfg.tenant))
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: bool(runner.ctx.snapshot.finished), timeout=60, what="snapshot finished")
        final = table_state(db)
        await wait_until(lambda: replay(jsonl(out)) == final, timeout=60, what="sink caught up")
    finally:
        await runner.drain()
        await task
        grow.close()
    assert 100 <= snapshot_rows_in(out) <= 100 + 15 * 2 and added >= 150


class RefusingProgress(MemoryCheckpointStore):
    """Refuses every write of snapshot progress while ``full`` (as a full disk would)."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True
        self.refused = 0

    async def put_many(self, values: dict[str, Any]) -> None:
        if self.full and any(k.endswith("::snapshot") for k in values):
            self.refused += 1
            raise OSError(28, "No space left on device")
        await super().put_many(values)


async def test_snapshot_progress_met_on_a_full_disk_is_waited_for_and_the_snapshot_goes_on(
    tmp_path: Path,
) -> None:
    """Snapshot progress is written beside the checkpoints: a write the disk refuses is tried
    again (degraded, ``state_store`` listed, nothing restarted), and the snapshot goes on once it
    holds, each row once."""
    from tests.helpers import restarts

    db, out = tmp_path / "app.db", tmp_path / "events.jsonl"
    existing_rows(db, 1000)
    d = doc(source_path=str(db), sinks=[{"type": "file", "config": {"id": "f", "path": str(out)}}],
            batch={"max_events": 100, "max_ms": 20})  # fmt: skip
    d["spec"]["source"]["config"].update(
        {"tables": ["items"], "snapshot": {"mode": "initial", "chunk_size": 100}}
    )
    store = RefusingProgress()
    runner = PipelineRunner(parse_pipeline(d, env={}), store=store)
    outages = runner.ctx.availability
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
    await wait_until(lambda: store.refused > 3, what="the progress write tried again")
    assert runner.state == "running"
    store.full = False
    await wait_until(lambda: bool(runner.ctx.snapshot.finished), timeout=60, what="snapshot finished")
    assert not outages.degraded
    await runner.drain()
    await task
    assert snapshot_rows_in(out) == 1000  # each row once
    check_handoff(out, table_state(db), crashes=False)
    assert restarts(runner.snapshot()) == 0


async def _add_a_column_with_a_default(
    tmp_path: Path, source: type[TursoSource] = TursoSource
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]], PipelineRunner]:
    """50 rows delivered, then ``ADD COLUMN note`` (NULL), ``ADD COLUMN extra DEFAULT 7`` and a
    row 51, under ``on_column_change: snapshot``, until the table has been read again: the logs,
    the last image of each row in the sink, and the (drained) runner."""
    db, out = tmp_path / "app.db", tmp_path / "events.jsonl"
    w = turso.connect(str(db))
    w.execute("PRAGMA unstable_capture_data_changes_conn('full')")
    w.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, payload TEXT)")
    w.executemany("INSERT INTO items VALUES (?, ?, 'x')", [(i, i) for i in range(1, 51)])
    w.commit()
    d = doc(source_path=str(db), sinks=[{"type": "file", "config": {"id": "f", "path": str(out)}}],
            batch={"max_events": 100, "max_ms": 20})  # fmt: skip
    d["spec"]["source"]["config"].update(
        {"tables": ["items"], "snapshot": {"mode": "never", "on_column_change": "snapshot"}}
    )
    cfg = parse_pipeline(d, env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=source(cfg.source.config, cfg.tenant))
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: len(jsonl(out)) == 50, timeout=30, what="the inserts")
        w.execute("ALTER TABLE items ADD COLUMN note TEXT")  # rows NULL in it: not counted
        w.execute("ALTER TABLE items ADD COLUMN extra INTEGER DEFAULT 7")
        w.commit()
        w.execute("INSERT INTO items VALUES (51, 51, 'x', NULL, 8)")
        w.commit()
        await wait_until(lambda: bool(runner.ctx.snapshot.finished), timeout=30, what="the table read again")
        await runner.drain()
        await task
    w.close()
    return logs, {int(e["after"]["id"]): e["after"] for e in jsonl(out) if e["after"]}, runner


async def test_a_column_added_with_a_default_is_snapshotted_again(tmp_path: Path) -> None:
    """``ADD COLUMN ... DEFAULT 7`` gives every row a 7 (Turso reads it back so) with no change:
    their inserts went out without the column. The change after the DDL shows it: named in
    ``columns_changed``, and with ``on_column_change: snapshot`` the table is read again, every
    row with its 7."""
    logs, rows, _ = await _add_a_column_with_a_default(tmp_path)
    said = [e for e in logs if e["event"] == "columns_changed"]
    assert [(e["table"], e["added"], e["retyped"]) for e in said] == [("items", ["extra"], [])]
    assert len(rows) == 51 and rows.pop(51)["extra"] == 8
    assert {r["extra"] for r in rows.values()} == {7}


async def test_a_source_down_while_a_column_change_asks_for_a_snapshot_is_waited_for(tmp_path: Path) -> None:
    """The snapshot a column change asks for needs the source's server; down at that moment, it
    is unavailable like any read: the reader reconnects and the change is acted on then. Before,
    the schema was recorded first and the error crashed the reader outside its unavailability
    handling, so after the restart the change was known already and no snapshot ever came."""
    asked = 0

    class Down(TursoChunks):
        async def tables(self, names: list[str] | None) -> list[TableRef]:
            nonlocal asked
            asked += 1
            if asked == 1:
                raise SourceUnavailable("turso source 'src': down for the test")
            return await super().tables(names)

    class Source(TursoSource):
        def chunk_reader(self, settings: Any) -> Any:
            return Down(self)

    _, rows, runner = await _add_a_column_with_a_default(tmp_path, Source)
    assert asked > 1 and runner.failure is None and runner.ctx.stats.source_errors >= 1  # asked again
    assert len(rows) == 51 and rows.pop(51)["extra"] == 8
    assert {r["extra"] for r in rows.values()} == {7}


async def test_a_stream_behind_the_snapshot_windows_is_said_and_its_lag_shown(tmp_path: Path) -> None:
    """Each window's wait for its high watermark is the stream's lag: over
    ``stream_lag_warning_s`` it is logged (``snapshot_stream_behind``, again each time it
    doubles), and shown in the snapshot's status and in metrics while the snapshot runs. The
    threshold here is a microsecond, so every real window is over it."""
    from tests.kit import ScriptedSink
    from tests.test_metrics import scrape, value

    db = tmp_path / "app.db"
    existing_rows(db, 10_000)  # far more than the mailboxes hold while the sink holds
    d = doc(source_path=str(db), sinks=[{"type": "file", "config": {"id": "f", "path": "unused"}}],
            batch={"max_events": 100, "max_ms": 20})  # fmt: skip
    d["spec"]["source"]["config"].update(
        {
            "tables": ["items"],
            "snapshot": {"mode": "initial", "chunk_size": 100, "stream_lag_warning_s": 1e-6},
        }
    )
    held, gate = asyncio.Event(), asyncio.Event()

    async def hold_from_the_third(call: int, events: list[Any]) -> None:
        if call >= 3:  # the snapshot runs on, with windows closed, while the sink holds
            held.set()
            await gate.wait()

    sink = ScriptedSink("f", script=hold_from_the_third)
    runner = PipelineRunner(parse_pipeline(d, env={}), store=MemoryCheckpointStore(), sinks={"f": sink})
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await held.wait()
        status = runner.ctx.snapshot
        assert status.running and status.waits.last_s is not None
        shown = status.to_dict()["current"]
        samples = await scrape({"t": runner})
        assert value(samples, "deltaforge_snapshot_window_wait_seconds", pipeline="t") > 0
        assert 0 < shown["window_wait_ms"] <= shown["window_wait_max_ms"]
        gate.set()
        await wait_until(lambda: bool(status.finished), timeout=60, what="snapshot finished")
        await runner.drain()
        await task
    said = [e for e in logs if e["event"] == "snapshot_stream_behind"]
    assert said and all(e["log_level"] == "warning" and e["warn_s"] == 1e-6 for e in said)
    waits = [e["waited_s"] for e in said]
    # each said at least twice the one before (give or take the log's rounding to a millisecond)
    assert all(later >= 2 * earlier - 0.001 for earlier, later in itertools.pairwise(waits))
    assert status.finished[0]["window_wait_max_ms"] >= 1000 * max(waits) - 1
    assert not any(e["event"] == "snapshot_stream_caught_up" for e in logs)


async def test_after_change_ids_start_again_the_new_snapshot_and_changes_reach_the_sinks(
    tmp_path: Path, postgres: Postgres
) -> None:
    """``turso_cdc`` emptied while read: Turso's change ids start again at 1, below every sink's
    position (a lost position, taken again under ``when_needed``). The new snapshot's rows and
    every change after must sort after what the sinks hold: the file sink skipped them as held
    already, and a PostgreSQL target with ``if_newer`` kept its older rows, the newer ones
    refused as stale. Both now end equal to the source."""
    db = tmp_path / "s.db"
    w = written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    for sql in [f"INSERT INTO t VALUES ({i}, 'a{i}')" for i in range(1, 6)] + [
        f"UPDATE t SET v = 'b{i}' WHERE id = 1"
        for i in range(20)  # change ids well past the reset's
    ]:
        w.execute(sql)
        w.commit()
    target = await pg_target(postgres, "CREATE TABLE t (id int PRIMARY KEY, v text, _df_position text)")
    out = tmp_path / "events.jsonl"
    source = {"type": "turso", "config": {"id": "tu", "path": str(db), "snapshot": {"mode": "when_needed"}}}
    spec = into_target("reset", source, postgres.dsn(target))
    spec["spec"]["sinks"].append({"type": "file", "config": {"id": "f", "path": str(out)}})
    async with running(spec) as runner:
        await wait_until(lambda: runner.ctx.stats.events_committed >= 5, timeout=30, what="the snapshot")
        for sql in (
            "DELETE FROM turso_cdc",
            "UPDATE t SET v = 'after' WHERE id = 2",
            "INSERT INTO t VALUES (9, 'new')",
        ):
            w.execute(sql)
            w.commit()
        await wait_until(
            lambda: "v" in str(rows_of(out).get(9)), timeout=30, what="the row written after the reset"
        )
        w.execute("UPDATE t SET v = 'later' WHERE id = 3")
        w.commit()
        await wait_until(
            lambda: rows_of(out).get(3) == {"id": 3, "v": "later"}, timeout=30, what="a later change"
        )
    want = {int(i): v for i, v in w.execute("SELECT id, v FROM t").fetchall()}
    w.close()
    assert {k: r["v"] for k, r in rows_of(out).items()} == want
    assert dict(await pg_rows(postgres.dsn(target), "SELECT id, v FROM t")) == want


def rows_of(out: Path) -> dict[int, Any]:
    """The rows a file sink's events leave, by id."""
    rows: dict[int, Any] = {}
    for d in jsonl(out) if out.exists() else []:
        image = d.get("after") or d.get("before")
        if image is not None:
            if d["op"] == "d":
                rows.pop(image["id"], None)
            else:
                rows[image["id"]] = image
    return rows
