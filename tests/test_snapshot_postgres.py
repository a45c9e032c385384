"""Snapshots from PostgreSQL through ``serve``: the handoff to streaming, proven under writes and SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psycopg
import pytest
import yaml
from structlog.testing import capture_logs

from deltaforge.configmodel import SnapshotSettings
from deltaforge.snapshot.chunks import SnapshotRefused
from deltaforge.sources.postgres.snapshot import PostgresChunks
from tests.helpers import jsonl, on_terminal, stored_checkpoint, wait_until_sync
from tests.postgres_kit import TYPES, chunk_reader_on, fresh_db, read_n, source
from tests.serve_proc import serve_pipeline
from tests.servers.postgres import Postgres
from tests.servers.proxy import TcpProxy
from tests.snapshot_kit import (
    Execute,
    Writer,
    check_handoff,
    frozen_mid_snapshot,
    kill_during_snapshot,
    pipeline_spec,
    replay,
    snapshot_done,
    snapshot_rows_in,
    snapshot_status,
)

ROWS = 200_000


def spec(tmp: Path, pg: Postgres, db: str, **snapshot: Any) -> dict[str, Any]:
    config = {"id": "pg", "dsn": pg.dsn(db), "slot": f"s_{db}", "publication": f"p_{db}",
              "tables": ["public.items"], "heartbeat_ms": 200, "poll_interval_ms": 20}  # fmt: skip
    return pipeline_spec(tmp, "postgres", config, **snapshot)


_DATABASES: list[str] = []


@pytest.fixture(autouse=True)
def drop_slots(postgres: Postgres) -> Iterator[None]:
    """Each test's slot goes with it: the session's server has a fixed number of slots."""
    yield
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        for db in _DATABASES:
            slot = f"s_{db}"
            for _ in range(100):  # a walsender that was just killed may hold it for a moment
                row = conn.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
                if row is None:
                    break
                if row[0] is not None:
                    conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                    conn.execute("SELECT pg_sleep(0.05)")  # the server's own pace: the backend exits
                    continue
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        _DATABASES.clear()


def prepare(pg: Postgres, rows: int) -> str:
    db = asyncio.run(fresh_db(pg))
    _DATABASES.append(db)
    with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL, payload text)")
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # deletes carry v (the proof's stamps)
        conn.execute("INSERT INTO items SELECT g, g, repeat('x', 40) FROM generate_series(1, %s) g", (rows,))
        conn.execute("ANALYZE items")
    return db


def writer(pg: Postgres, db: str, rows: int, seed: int) -> Writer:
    def connect() -> tuple[Execute, Any]:
        conn = psycopg.connect(pg.dsn(db), autocommit=True)
        return (lambda sql, args: conn.execute(sql, args)), conn.close  # type: ignore[arg-type]

    return Writer(connect, rows, seed)


def table_state(pg: Postgres, db: str) -> dict[int, int]:
    with psycopg.connect(pg.dsn(db)) as conn:
        return {int(i): int(v) for i, v in conn.execute("SELECT id, v FROM items").fetchall()}


def wal_now(pg: Postgres, db: str) -> int:
    async def get() -> int:
        conn = await asyncpg.connect(pg.dsn(db))
        try:
            return int(await conn.fetchval("SELECT pg_current_wal_lsn()"))
        finally:
            await conn.close()

    return asyncio.run(get())


def caught_up(tmp: Path, target: int) -> bool:
    cp = stored_checkpoint(tmp / "cp.db", "pg::sink::f")
    return cp is not None and int(cp["lsn"]) >= target


def test_snapshot_under_writes_hands_off_to_streaming_without_gaps_or_stale_rows(
    postgres: Postgres, tmp_path: Path
) -> None:
    db = prepare(postgres, ROWS)
    work = writer(postgres, db, ROWS, seed=1)
    with serve_pipeline(tmp_path, spec(tmp_path, postgres, db)) as serve:
        work.start()
        try:
            wait_until_sync(lambda: snapshot_done(serve), timeout=300, what="snapshot finished")
        finally:
            work.stop.set()
            work.join(10)
        assert work.error is None, work.error
        target = wal_now(postgres, db)
        wait_until_sync(lambda: caught_up(tmp_path, target), timeout=120, what="sink caught up")
        status = snapshot_status(serve)
        assert serve.terminate() == 0
    assert min(work.ops.values()) > 0, work.ops  # every kind of write happened during the snapshot
    snapshot_rows = check_handoff(tmp_path / "events.jsonl", table_state(postgres, db), crashes=False)
    # Each row is read once (rows changed inside a window come as changes instead); rows inserted
    # or moved past the snapshot's cursor during it are read too.
    assert 0 < snapshot_rows <= ROWS + work.ops["insert"] + work.ops["move"]
    assert status["finished"][0]["kind"] == "initial"
    assert status["finished"][0]["tables"]["public.items"]["done"] is True


@pytest.mark.slow
def test_snapshot_killed_mid_way_resumes_from_the_next_chunk(postgres: Postgres, tmp_path: Path) -> None:
    db = prepare(postgres, ROWS)
    doc = spec(tmp_path, postgres, db)
    out = tmp_path / "events.jsonl"
    work = writer(postgres, db, ROWS, seed=2)
    kills = 3
    try:
        kill_during_snapshot(tmp_path, doc, work, ROWS, kills)
        with serve_pipeline(tmp_path, doc) as serve:
            wait_until_sync(lambda: snapshot_done(serve), timeout=300, what="snapshot finished")
            work.stop.set()
            work.join(10)
            target = wal_now(postgres, db)
            wait_until_sync(lambda: caught_up(tmp_path, target), timeout=120, what="sink caught up")
            assert serve.terminate() == 0
    finally:
        work.stop.set()
    assert work.error is None, work.error
    snapshot_rows = check_handoff(out, table_state(postgres, db), crashes=True)
    # Each kill repeats at most the chunks not yet checkpointed, never the whole table again.
    assert snapshot_rows < ROWS + kills * 10 * 5000, snapshot_rows


def walsenders(postgres: Postgres) -> set[int]:
    """The client ports of the server's replication connections (the streams)."""
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        return {port for (port,) in conn.execute("SELECT client_port FROM pg_stat_replication")}


def test_a_snapshot_whose_connections_go_silent_gives_them_up_and_finishes(
    postgres: Postgres, tmp_path: Path
) -> None:
    """A chunk read on a connection that answers nothing and closes nothing (the server's host
    vanished, a NAT forgot it) waited for ever: the snapshot stalled, ``/health`` ok."""
    rows = 50_000
    db = prepare(postgres, rows)
    doc = spec(tmp_path, postgres, db, chunk_size=1000)
    frozen_mid_snapshot(tmp_path, doc, rows, postgres.port, lambda: walsenders(postgres))
    check_handoff(tmp_path / "events.jsonl", table_state(postgres, db), crashes=True)


def test_a_stop_while_a_chunk_read_waits_on_the_server_delivers_what_was_handed_on_and_ends(
    postgres: Postgres, tmp_path: Path
) -> None:
    """A drain asks the reader to stop reading, and a reader in a chunk read the server does not
    answer (waiting on a lock here; a server stopped or its host frozen alike) answered only once
    the read ended: the drain waited its 30 s and ended ``pipeline_drain_incomplete``. It now
    delivers what the reader handed on and the stop ends the read."""
    db = prepare(postgres, 100_000)
    doc = spec(tmp_path, postgres, db, chunk_size=100)
    doc["source"]["config"]["query_timeout_s"] = 600
    out = tmp_path / "events.jsonl"
    waiting = "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock')"
    with serve_pipeline(tmp_path, doc) as serve:
        wait_until_sync(lambda: snapshot_rows_in(out) >= 1000, 60, "the snapshot under way")
        with psycopg.connect(postgres.dsn(db)) as locker, psycopg.connect(postgres.dsn(db)) as look:
            locker.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")  # held until the block ends
            wait_until_sync(
                lambda: bool(look.execute(waiting, (db,)).fetchone()[0]), 30, "a chunk read waiting"
            )
            assert not snapshot_done(serve)
            assert serve.terminate(timeout=60) == 0
    said = [e["event"] for e in jsonl(tmp_path / "log.jsonl")]
    assert "drain_without_reader" in said, said[-20:]
    assert "pipeline_drained" in said and "pipeline_drain_incomplete" not in said, said[-20:]


def test_on_demand_snapshot_over_rest_while_streaming(postgres: Postgres, tmp_path: Path) -> None:
    db = prepare(postgres, 3000)
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute("CREATE TABLE other (k text PRIMARY KEY, n int)")
        conn.execute("INSERT INTO other SELECT 'k' || g, g FROM generate_series(1, 500) g")
    doc = spec(tmp_path, postgres, db, mode="never", chunk_size=200)
    doc["source"]["config"]["tables"] = ["public.items", "public.other"]
    out = tmp_path / "events.jsonl"
    with serve_pipeline(tmp_path, doc) as serve:
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute("UPDATE items SET v = -1 WHERE id = 1")
        wait_until_sync(lambda: any(d["op"] == "u" for d in jsonl(out)), timeout=30, what="a change streamed")
        assert not any(d["op"] == "r" for d in jsonl(out))  # mode never: no snapshot at start
        bad = httpx.post(serve.url("/pipelines/shop/snapshots"), json={"tables": ["public.nope"]}, timeout=30)
        assert bad.status_code == 400 and "no such table" in bad.json()["message"]
        resp = httpx.post(
            serve.url("/pipelines/shop/snapshots"), json={"tables": ["public.other"]}, timeout=30
        )
        assert resp.status_code == 202, resp.text
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="snapshot finished")
        finished = snapshot_status(serve)["finished"][0]
        assert finished["kind"] == "incremental"
        assert finished["tables"]["public.other"]["rows"] == 500
        metrics = serve.get("/metrics").text
        assert 'deltaforge_snapshot_rows_total{pipeline="shop"} 500.0' in metrics
        assert serve.terminate() == 0
    rows = [d for d in jsonl(out) if d["op"] == "r"]
    assert sorted(d["after"]["n"] for d in rows) == list(range(1, 501))
    assert {d["source"]["table"] for d in rows} == {"other"}


def test_when_needed_resnapshots_a_dropped_slot_instead_of_halting(
    postgres: Postgres, tmp_path: Path
) -> None:
    db = prepare(postgres, 2000)
    doc = spec(tmp_path, postgres, db, mode="when_needed", chunk_size=300)
    out = tmp_path / "events.jsonl"
    with serve_pipeline(tmp_path, doc) as serve:
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="initial snapshot")
        target = wal_now(postgres, db)
        wait_until_sync(lambda: caught_up(tmp_path, target), timeout=60, what="sink caught up")
        assert serve.terminate() == 0
    assert snapshot_rows_in(out) == 2000
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (f"s_{db}",))
        conn.execute("UPDATE items SET v = v + 1000000 WHERE id <= 10")  # lost with the slot
    with serve_pipeline(tmp_path, doc) as serve:
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="the snapshot taken again")
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute("UPDATE items SET v = v + 2000000 WHERE id = 2000")  # streaming goes on after it
        target = wal_now(postgres, db)
        wait_until_sync(lambda: caught_up(tmp_path, target), timeout=60, what="sink caught up")
        assert serve.get("/pipelines/shop").json()["state"] == "running"
        assert serve.terminate() == 0
    assert "position_lost_resnapshot" in (tmp_path / "log.jsonl").read_text()
    check_handoff(out, table_state(postgres, db), crashes=True)
    assert snapshot_rows_in(out) == 4000


def test_after_a_restore_from_an_older_copy_the_new_snapshot_and_changes_reach_the_sink(
    tmp_path: Path,
) -> None:
    """The server is restored from a copy of its files older than every sink's position (no slot
    there yet): ``when_needed`` takes the table again, from WAL positions below those the sinks
    hold. Its rows, and every change after, must sort after them, or the sink skips them as held
    already (it did: nothing after the restore reached the file). A server of its own: the
    restore takes the whole cluster back."""
    with Postgres() as pg:
        db = asyncio.run(fresh_db(pg))
        with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL, payload text)")
            conn.execute("INSERT INTO items SELECT g, g, repeat('x', 40) FROM generate_series(1, 300) g")
        pg.halt()
        copy = pg.copy_files()
        pg.resume()
        doc = spec(tmp_path, pg, db, mode="when_needed", chunk_size=100)
        out = tmp_path / "events.jsonl"
        with serve_pipeline(tmp_path, doc) as serve:
            wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="initial snapshot")
            with psycopg.connect(pg.dsn(db), autocommit=True) as conn:  # WAL well past the copy's
                for i in range(1, 101):
                    conn.execute("UPDATE items SET v = v + 1, payload = repeat('y', 400) WHERE id = %s", (i,))
            target = wal_now(pg, db)
            wait_until_sync(lambda: caught_up(tmp_path, target), timeout=60, what="sink caught up")
            assert serve.terminate() == 0
        pg.halt()
        pg.restore_files(copy)
        pg.resume()
        with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
            conn.execute("UPDATE items SET v = v + 1000000 WHERE id <= 10")  # a change after the restore
        with serve_pipeline(tmp_path, doc) as serve:
            wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="the snapshot taken again")
            with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
                conn.execute("UPDATE items SET v = 7 WHERE id = 300")  # streaming goes on after it
            assert target > wal_now(pg, db)  # the new positions lie below what the sink held
            wait_until_sync(
                lambda: snapshot_rows_in(out) == 600 and replay(jsonl(out)).get(300) == 7,
                timeout=60, what="the new snapshot and the change after it in the file",
            )  # fmt: skip
            assert serve.terminate() == 0
        assert "position_lost_resnapshot" in (tmp_path / "log.jsonl").read_text()
        assert replay(jsonl(out)) == table_state(pg, db)


def test_initial_snapshot_of_two_tables_in_parallel_then_streaming(
    postgres: Postgres, tmp_path: Path
) -> None:
    db = prepare(postgres, 3000)
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute("CREATE TABLE other (k text PRIMARY KEY, n int)")
        conn.execute("INSERT INTO other SELECT 'k' || g, g FROM generate_series(1, 2000) g")
    doc = spec(tmp_path, postgres, db, chunk_size=500, max_parallel_tables=2)
    doc["source"]["config"]["tables"] = ["public.items", "public.other"]
    out = tmp_path / "events.jsonl"
    with serve_pipeline(tmp_path, doc) as serve:
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="initial snapshot")
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute("INSERT INTO other VALUES ('new', 0)")
        wait_until_sync(lambda: any(d["op"] == "c" for d in jsonl(out)), timeout=30, what="a change streamed")
        assert serve.terminate() == 0
    lines = jsonl(out)
    rows = [d for d in lines if d["op"] == "r"]
    assert sorted(d["after"]["id"] for d in rows if d["source"]["table"] == "items") == list(range(1, 3001))
    assert sorted(d["after"]["n"] for d in rows if d["source"]["table"] == "other") == list(range(1, 2001))
    # Both tables were read in the same windows: one high watermark, rows of both just after it.
    windows: dict[str, set[str]] = {}
    for d in rows:
        windows.setdefault(d["tx"]["id"], set()).add(d["source"]["table"])
    assert sum(1 for tables in windows.values() if tables == {"items", "other"}) == 4
    assert lines[-1]["op"] == "c" and lines[-1]["after"]["k"] == "new"  # streaming after the snapshot


@pytest.mark.parametrize("on_column_change", ["warn", "snapshot"])
def test_a_column_added_with_a_default_is_said_or_snapshotted_again(
    postgres: Postgres, tmp_path: Path, on_column_change: str
) -> None:
    """``ADD COLUMN ... DEFAULT 7`` gives every existing row a 7 with no change event: the sinks
    kept those rows without it, and nothing said so. The next change of the table shows the new
    column: ``columns_changed`` names it (and the command that fixes it; not a column added that
    leaves the rows NULL), and with
    ``on_column_change: snapshot`` the table is read again, so every row arrives with its 7."""
    db = prepare(postgres, 300)
    doc = spec(tmp_path, postgres, db, mode="never", on_column_change=on_column_change)
    out = tmp_path / "events.jsonl"
    with serve_pipeline(tmp_path, doc) as serve:
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1000, 1000, 'before')")
            wait_until_sync(lambda: len(jsonl(out)) == 1, timeout=30, what="a change before the DDL")
            # note leaves every row NULL, so changes none: not counted
            conn.execute("ALTER TABLE items ADD COLUMN note text, ADD COLUMN extra int NOT NULL DEFAULT 7")
            conn.execute("INSERT INTO items VALUES (1001, 1001, 'after', NULL, 8)")
        if on_column_change == "snapshot":
            wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="the table read again")
        else:
            wait_until_sync(lambda: len(jsonl(out)) == 2, timeout=30, what="the change after the DDL")
        assert serve.terminate() == 0
    said = [e for e in jsonl(tmp_path / "log.jsonl") if e["event"] == "columns_changed"]
    assert [(e["table"], e["added"], e["retyped"], e["action"]) for e in said] == [
        ("public.items", ["extra"], [], "none" if on_column_change == "warn" else "snapshot")
    ]
    rows = {int(d["after"]["id"]): d["after"] for d in jsonl(out)}  # inserts and snapshot rows only
    if on_column_change == "warn":
        assert "deltaforge snapshot shop public.items" in said[0]["reason"]  # a command to run as it is
        assert rows[1000] == {"id": 1000, "v": 1000, "payload": "before"}  # what the sinks keep
    else:
        assert len(rows) == 302 and {r["extra"] for i, r in rows.items() if i != 1001} == {7}
        assert rows[1001]["extra"] == 8


@pytest.mark.parametrize("on_column_change", ["warn", "snapshot"])
def test_an_enum_value_renamed_is_said_or_snapshotted_again(
    postgres: Postgres, tmp_path: Path, on_column_change: str
) -> None:
    """``ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'`` changes every row holding ``'sad'`` (as
    the enum, in an array of it, through a domain over it, inside a composite) with no change event, and no Relation
    message follows: the sinks kept ``'sad'`` and nothing said so. The watch that asks after the
    publication every few seconds compares the labels of the enums captured columns use:
    ``columns_changed`` names the columns, and with ``on_column_change: snapshot`` the table is
    read again. A value added changes no row and is not named; nor is an enum no captured column
    uses. Renamed while no pipeline runs, it is named at the next start."""
    db = prepare(postgres, 0)
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('happy', 'sad')")
        conn.execute("CREATE TYPE other AS ENUM ('x')")
        conn.execute("CREATE DOMAIN feeling AS mood")
        conn.execute("CREATE TYPE how AS (how mood, n int)")
        conn.execute("CREATE TABLE elsewhere (id int PRIMARY KEY, o other)")
        conn.execute(
            "ALTER TABLE items ADD COLUMN m mood, ADD COLUMN ms mood[], ADD COLUMN f feeling, ADD COLUMN p how"
        )
        conn.execute(
            "INSERT INTO items VALUES (1, 1, 'a', 'sad', '{happy,sad}', 'sad', '(sad,1)'), "
            "(2, 2, 'b', 'happy', '{}', NULL, NULL)"
        )
    doc = spec(tmp_path, postgres, db, mode="initial", on_column_change=on_column_change)
    out = tmp_path / "events.jsonl"

    def said() -> list[dict[str, Any]]:
        return [e for e in jsonl(tmp_path / "log.jsonl") if e["event"] == "columns_changed"]

    with serve_pipeline(tmp_path, doc) as serve:
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="the first snapshot")
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute("ALTER TYPE mood ADD VALUE 'calm'")  # changes no row
            conn.execute("ALTER TYPE other RENAME VALUE 'x' TO 'y'")  # no captured column
            conn.execute("ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'")
        wait_until_sync(lambda: said(), timeout=30, what="the rename named")
        if on_column_change == "snapshot":
            wait_until_sync(lambda: len(jsonl(out)) == 4, timeout=60, what="the table read again")
        assert serve.terminate() == 0
    assert [(e["table"], e["added"], e["retyped"], e["action"]) for e in said()] == [
        ("public.items", [], ["m", "ms", "f", "p"], "none" if on_column_change == "warn" else "snapshot")
    ]
    rows = [d["after"] for d in jsonl(out)]
    if on_column_change == "snapshot":
        assert [(r["m"], r["ms"], r["f"]) for r in rows[2:] if r["id"] == 1] == [
            ("blue", ["happy", "blue"], "blue")
        ]
        return
    assert "ALTER TYPE mood RENAME VALUE ('sad' to 'blue')" in said()[0]["reason"]
    assert "deltaforge snapshot shop public.items" in said()[0]["reason"]
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute("ALTER TYPE mood RENAME VALUE 'happy' TO 'glad'")  # while no pipeline runs
    with serve_pipeline(tmp_path, doc) as serve:
        wait_until_sync(lambda: len(said()) == 2, timeout=30, what="the rename named at start")
        assert serve.terminate() == 0
    assert (said()[1]["table"], said()[1]["retyped"]) == ("public.items", ["m", "ms", "f", "p"])


def test_serve_on_a_terminal_draws_snapshot_progress(postgres: Postgres, tmp_path: Path) -> None:
    db = prepare(postgres, 100_000)
    doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "shop"},
           "spec": spec(tmp_path, postgres, db, chunk_size=1000)}  # fmt: skip
    cfg = tmp_path / "shop.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    serve, screen = on_terminal(
        [sys.executable, "-m", "deltaforge", "serve", "--config", str(cfg), "--api-addr", "off", "--quiet"],
        tmp_path,
    )
    bar = re.compile(r"shop public\.items.*?(\d+)/(\d+)\s+([0-9,]+) rows/s")

    def shows_progress() -> bool:
        return any(0 < int(done) < int(total) for done, total, _ in bar.findall(screen.read()))

    try:
        wait_until_sync(shows_progress, timeout=60, what="a progress bar part way")
    finally:
        serve.terminate()
        serve.wait(30)
        os.close(screen.leader)
    _, total, _ = next(m for m in bar.findall(screen.text) if 0 < int(m[0]) < int(m[1]))
    assert int(total) == 100_000  # the server's estimate, after ANALYZE


def test_a_signal_row_asks_for_a_snapshot_on_postgres(postgres: Postgres, tmp_path: Path) -> None:
    db = prepare(postgres, 500)
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data text)"
        )
    doc = spec(tmp_path, postgres, db, mode="never", chunk_size=100, signal_table="public.dbz_signal")
    out = tmp_path / "events.jsonl"
    with serve_pipeline(tmp_path, doc) as serve:
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', "
                """'{"data-collections": ["public.items"], "type": "incremental"}')"""
            )
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="snapshot by signal row")
        assert serve.terminate() == 0
    lines = jsonl(out)
    assert sorted(d["after"]["id"] for d in lines if d["op"] == "r") == list(range(1, 501))
    assert {d["source"]["table"] for d in lines} == {"items"}  # the signal row itself is not delivered


def test_a_publications_row_filter_and_column_list_hold_for_snapshot_rows_too(
    postgres: Postgres, tmp_path: Path
) -> None:
    """A user's publication may publish some rows (a row filter) and some columns (a column list,
    how personal data is kept out of a publication); its changes carry only those, so the
    snapshot must too. Read whole, it delivered the columns the user kept out, and rows outside
    the filter whose later changes are never published: they stayed in every sink for good."""
    db = prepare(postgres, 1000)
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        # What the filter and column list name must be the replica identity, for updates and deletes.
        conn.execute("CREATE UNIQUE INDEX items_id_v ON items (id, v)")
        conn.execute("ALTER TABLE items REPLICA IDENTITY USING INDEX items_id_v")
        conn.execute(f"CREATE PUBLICATION p_{db} FOR TABLE items (id, v) WHERE (v % 2 = 0)")
    out = tmp_path / "events.jsonl"
    with serve_pipeline(tmp_path, spec(tmp_path, postgres, db, chunk_size=100)) as serve:
        wait_until_sync(lambda: snapshot_done(serve), timeout=60, what="initial snapshot")
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            conn.execute("UPDATE items SET v = v + 1 WHERE id IN (2, 3)")  # 2 leaves the filter, 3 enters
            conn.execute("DELETE FROM items WHERE id IN (4, 5)")
            conn.execute("INSERT INTO items VALUES (2001, 2001, 'y'), (2002, 2002, 'y')")
        target = wal_now(postgres, db)
        wait_until_sync(lambda: caught_up(tmp_path, target), timeout=60, what="sink caught up")
        assert serve.terminate() == 0
    lines = jsonl(out)
    assert snapshot_rows_in(out) == 500
    assert not [d for d in lines if "payload" in {**(d["before"] or {}), **(d["after"] or {})}]
    assert replay(lines) == {i: v for i, v in table_state(postgres, db).items() if v % 2 == 0}
    filtered = [
        json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines() if "publication_filters" in x
    ]
    assert filtered and filtered[0]["tables"] == {
        "public.items": {"columns": ["id", "v"], "rows": "((v % (2)::bigint) = 0)"}
    }


def test_a_column_added_or_dropped_between_chunks_is_in_the_next_chunk_as_it_is_now(
    postgres: Postgres,
) -> None:
    """The chunk query names the table's columns; after an ALTER TABLE the next chunk is read
    with the columns the table has then, not those it had when the snapshot began (a column
    added mid-snapshot was missing from every later snapshot row)."""

    async def run() -> list[list[Any]]:
        async with chunk_reader_on(postgres, "(1, 'a'), (2, 'b'), (3, 'c')") as (_, conn, reader, ref):
            first, after, _ = await reader.chunk(ref, None, 1)
            await conn.execute("ALTER TABLE t ADD COLUMN extra numeric NOT NULL DEFAULT 7.5")
            second, after, _ = await reader.chunk(ref, after, 1)
            await conn.execute("ALTER TABLE t DROP COLUMN v")
            third, _, more = await reader.chunk(ref, after, 1)
        return [first, second, third, [more]]

    first, second, third, [more] = asyncio.run(run())
    assert first == [{"id": 1, "v": "a"}]
    assert second == [{"id": 2, "v": "b", "extra": pytest.approx(7.5)}]
    assert third == [{"id": 3, "extra": pytest.approx(7.5)}] and not more


async def streamed_then_snapshotted(
    postgres: Postgres, ddl: str, table: str, *inserts: str
) -> tuple[list[Any], list[Any]]:
    """``table`` made by ``ddl`` in a fresh database, each of ``inserts`` streamed; then the
    table's rows as a snapshot chunk reads them, and the changes' after images."""
    db = await fresh_db(postgres)
    _DATABASES.append(db)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(ddl)
    src = source(postgres, db, tables=[f"public.{table}"])
    await src.open(None)
    for sql in inserts:
        await conn.execute(sql)
    changes = [e.after for e in await read_n(src, len(inserts))]
    reader = PostgresChunks(src, SnapshotSettings())
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"public.{table}"])
        rows, _, _ = await reader.chunk(ref, None, 10)
    finally:
        await reader.close()
        await src.close()
        await conn.close()
    return rows, changes


def test_a_snapshot_row_carries_the_values_a_change_of_the_row_carries(postgres: Postgres) -> None:
    """Every type the change stream converts, and NULL in each: a chunk's rows equal the
    inserts' row images (chunk rows are built by a function generated for the table's columns;
    a NULL must not reach a column's converter)."""

    rows, changes = asyncio.run(
        streamed_then_snapshotted(
            postgres,
            TYPES,
            "types",
            "INSERT INTO types VALUES (1, 9007199254740993, 12345678901234.123456, -2.5e100, 'héllo ✓', "
            "'\\x00ff10', true, '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.5+02', "
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, \"two\"]}', '{\"z\": null}', '{1,2,NULL}', "
            "'{\"a b\",c}', 3)",
            "INSERT INTO types (id) VALUES (2)",
        )
    )
    assert rows == changes
    assert rows[0]["num"] == Decimal("12345678901234.123456") and rows[0]["jb"] == {"z": None}
    assert rows[1] == {"id": 2, **{c: None for c in rows[0] if c != "id"}}


def test_snapshot_rows_leave_out_what_changes_leave_out(postgres: Postgres) -> None:
    """pgoutput (PostgreSQL 15) sends no generated column; a snapshot row carrying one held a
    value no later change of the row replaced. A column list that leaves out the key cannot be
    read in key order: refused, saying so."""

    async def run() -> tuple[list[Any], str]:
        async with chunk_reader_on(postgres, "(1, 'a'), (2, 'b')") as (db, conn, reader, ref):
            await conn.execute("ALTER TABLE t ADD COLUMN w int GENERATED ALWAYS AS (id * 2) STORED")
            rows, _, _ = await reader.chunk(ref, None, 10)
            await conn.execute(f"ALTER PUBLICATION p_{db} SET TABLE t (v)")
            with pytest.raises(SnapshotRefused) as refused:
                await reader.tables(["public.t"])
        return rows, str(refused.value)

    rows, refused = asyncio.run(run())
    assert rows == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    assert "leaves key column(s) id out of its column list" in refused


def test_a_tables_row_estimate_holds_for_a_table_never_analyzed_or_grown_since(postgres: Postgres) -> None:
    """The progress bar's total and the ETA come from the server's row estimate. ``reltuples``
    was read: -1 for a table never analyzed (one loaded just before its snapshot), taken for 0,
    so the bar stood full and the ETA at 0 s from the first chunk on; and a table's count at its
    last analyze for one grown since. The planner's estimate scales to the table's size now."""

    async def run() -> tuple[int, int]:
        async with chunk_reader_on(postgres, "(0, 'a')") as (_, conn, reader, ref):
            await conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 49999) g")
            never_analyzed = await reader.estimate(ref)
            await conn.execute("ANALYZE t")
            await conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(50000, 149999) g")
            return never_analyzed, await reader.estimate(ref)

    never_analyzed, grown = asyncio.run(run())
    assert 25_000 <= never_analyzed <= 100_000, never_analyzed  # 50,000 rows
    assert 75_000 <= grown <= 300_000, grown  # 150,000 rows, 50,000 at the last analyze


def test_a_connection_lost_inside_a_chunk_read_is_unavailable_not_a_failure(postgres: Postgres) -> None:
    """The chunk's read runs in a transaction; a connection lost in it must surface as the
    server being unavailable (the pipeline waits), not as an error ending the transaction
    (``conn.transaction()``'s exit raised InterfaceError and the pipeline failed)."""
    from deltaforge.sources.base import SourceUnavailable

    async def run() -> BaseException | None:
        async with chunk_reader_on(postgres, "(1, 'a'), (2, 'b')") as (db, conn, reader, ref):
            locker = await asyncpg.connect(postgres.dsn(db))
            try:
                return await lose_the_connection_mid_chunk(db, conn, locker, reader, ref)
            finally:
                await locker.close()

    async def lose_the_connection_mid_chunk(
        db: str, conn: asyncpg.Connection, locker: asyncpg.Connection, reader: Any, ref: Any
    ) -> BaseException | None:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        read = asyncio.ensure_future(reader.chunk(ref, None, 10))
        # The chunk's read, waiting on the lock inside its transaction: that backend is the one.
        waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = $1"
        while (pid := await conn.fetchval(waiting, db)) is None:
            await asyncio.sleep(0.01)
        await conn.execute("SELECT pg_terminate_backend($1)", pid)
        try:
            await read
        except BaseException as exc:  # noqa: BLE001 - what it raised is the point
            return exc
        finally:
            await tx.rollback()
        return None

    raised = asyncio.run(run())
    assert isinstance(raised, SourceUnavailable), repr(raised)


def test_a_chunk_read_outlasting_the_databases_lock_and_statement_timeouts_is_waited_for(
    postgres: Postgres,
) -> None:
    """A database with ``lock_timeout`` and ``statement_timeout`` (common in production): a chunk
    read waiting behind an ``ALTER``'s lock longer than that was cancelled, an error. The
    snapshot's sessions turn the server's bounds off (``query_timeout_s`` is deltaforge's own),
    and the read waits for the lock, then reads."""

    async def run() -> list[Any]:
        async with chunk_reader_on(postgres, "(1, 'a'), (2, 'b')") as (db, conn, reader, ref):
            for setting in ("lock_timeout", "statement_timeout"):
                await conn.execute(f"ALTER DATABASE \"{db}\" SET {setting} = '200ms'")
            await reader.close()
            await reader.open(1)  # its connections made under the database's settings now
            locker = await asyncpg.connect(postgres.dsn(db))
            tx = locker.transaction()
            await tx.start()
            await locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            read = asyncio.ensure_future(reader.chunk(ref, None, 10))
            waited = (
                "SELECT clock_timestamp() - query_start > interval '1 s' FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = $1"
            )
            while not read.done() and not await conn.fetchval(waited, db):
                await asyncio.sleep(0.05)
            assert not read.done(), read
            await tx.rollback()
            await locker.close()
            rows, _, _ = await asyncio.wait_for(read, 30)
            return [r["id"] for r in rows]

    assert asyncio.run(run()) == [1, 2]


def test_a_connection_gone_silent_as_the_pool_takes_it_back_is_given_up(postgres: Postgres) -> None:
    """The pool takes a connection back by resetting it with a query of its own: a connection
    gone silent just after a chunk's answer (the proxy frozen between the two) held the
    snapshot for ever, found in CI once in five runs of the ``serve`` test above. It must be
    given up within ``query_timeout_s`` like a silent chunk read, and the next read go over a
    new connection."""
    from deltaforge.sources.base import SourceUnavailable

    async def run(proxy: TcpProxy) -> tuple[Exception | None, int]:
        db = await fresh_db(postgres)
        dsn = postgres.dsn(db).replace(f":{postgres.port}/", f":{proxy.port}/")
        reader = PostgresChunks(source(postgres, db, dsn=dsn, query_timeout_s=1), SnapshotSettings())
        await reader.open(1)

        async def answered_then_silent(conn: asyncpg.Connection) -> int:
            answer: int = await conn.fetchval("SELECT 1")
            proxy.freeze()
            return answer

        try:
            try:
                await reader._run(answered_then_silent)
                raised = None
            except Exception as exc:  # noqa: BLE001 - what it raised is the point
                raised = exc
            after: int = await reader._run(lambda conn: conn.fetchval("SELECT 2"))
            return raised, after
        finally:
            await reader.close()

    with TcpProxy(postgres.port) as proxy:
        raised, after = asyncio.run(asyncio.wait_for(run(proxy), 30))
    assert isinstance(raised, SourceUnavailable), repr(raised)
    assert "no answer for 1 s (query_timeout_s)" in str(raised)
    assert after == 2


def test_a_chunk_read_given_up_has_its_backend_ended_by_the_next_read(postgres: Postgres) -> None:
    """A chunk read whose connection went silent is given up, but its backend, blocked sending the
    chunk into a socket nobody reads (``ClientWrite``), kept its transaction, and with it vacuum's
    horizon: until TCP gave the connection up, never while the peer is alive and not reading. The
    next read ends it."""
    from deltaforge.sources.base import SourceUnavailable

    async def run(proxy: TcpProxy) -> tuple[BaseException | None, Any, Any]:
        db = await fresh_db(postgres)
        conn = await asyncpg.connect(postgres.dsn(db))
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        # 40 MB in one chunk: more than the sockets between the server and the reader hold.
        await conn.execute(
            "INSERT INTO t SELECT i, repeat(md5(i::text), 300) FROM generate_series(1, 4000) i"
        )
        await conn.execute(f"CREATE PUBLICATION p_{db} FOR TABLE t")
        dsn = postgres.dsn(db).replace(f":{postgres.port}/", f":{proxy.port}/")
        src = source(postgres, db, dsn=dsn, query_timeout_s=2)
        reader = PostgresChunks(src, SnapshotSettings())
        await reader.open(1)
        reading = (
            "SELECT pid, wait_event, backend_xmin FROM pg_stat_activity "
            "WHERE datname = $1 AND state = 'active' AND query LIKE 'SELECT % ORDER BY %' AND pid <> pg_backend_pid()"
        )
        try:
            (ref,) = await reader.tables(["public.t"])
            read = asyncio.ensure_future(reader.chunk(ref, None, 4000))
            while await conn.fetchrow(reading, db) is None:
                if read.done():  # read whole before a look found it running: read it again
                    read = asyncio.ensure_future(reader.chunk(ref, None, 4000))
                await asyncio.sleep(0.01)  # the server has no notification for a backend's state
            # Read whole, the chunk left the backend waiting on its socket only now and then, and
            # a quick reader could take it all between two looks (a CI run, 5 Dec): from now on
            # nothing reads what the backend sends, and it waits there for certain.
            proxy.hold()
            while (blocked := await conn.fetchrow(reading, db)) is None or blocked[1] != "ClientWrite":
                await asyncio.sleep(0.01)  # as above: no notification for a backend's wait
            proxy.freeze()
            raised = None
            try:
                await read
            except BaseException as exc:  # noqa: BLE001 - what it raised is the point
                raised = exc
            left = await conn.fetchrow(
                "SELECT wait_event, backend_xmin FROM pg_stat_activity WHERE pid = $1", blocked[0]
            )
            with capture_logs() as logs:
                await reader.last_key(ref)  # the next read, on a new connection
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while (
                gone := await conn.fetchval(
                    "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", blocked[0]
                )
            ) is False and loop.time() < deadline:
                await asyncio.sleep(0.05)  # the server has no notification for a backend's exit
            ended = [e for e in logs if e["event"] == "snapshot_read_ended"]
            await reader.last_key(ref)  # which finds it gone, and forgets it
            return raised, (left, gone, src.given_up), ended
        finally:
            await reader.close()
            await conn.close()

    with TcpProxy(postgres.port) as proxy:
        raised, (left, gone, given_up), ended = asyncio.run(asyncio.wait_for(run(proxy), 60))
    assert isinstance(raised, SourceUnavailable), repr(raised)
    assert left is not None and left[0] == "ClientWrite" and left[1] is not None, left  # holding the horizon
    assert gone, "the given-up read's backend is still there"
    assert len(ended) == 1 and "went silent" in ended[0]["reason"], ended
    assert given_up == {}, given_up  # forgotten once gone


def test_a_renamed_key_column_fails_the_chunk_instead_of_rebuilding_forever(postgres: Postgres) -> None:
    """The keyset pagination names the key column; once it is renamed, rebuilding the query
    from the new columns cannot help, so the chunk's error is raised, not retried without end."""

    async def run() -> None:
        async with chunk_reader_on(postgres, "(1, 'a'), (2, 'b')") as (_, conn, reader, ref):
            _, after, _ = await reader.chunk(ref, None, 1)
            await conn.execute("ALTER TABLE t RENAME COLUMN id TO ident")
            with pytest.raises(asyncpg.UndefinedColumnError):
                await asyncio.wait_for(reader.chunk(ref, after, 1), 30)

    asyncio.run(run())


MORE_TYPES = """CREATE TABLE more (id int PRIMARY KEY, r real, ra real[], sm smallint, mo money, iv interval,
    tm time, ttz timetz, n numeric, nn numeric, c char(5), ca char(3)[], bt bit(4), vb varbit, ip inet,
    cd cidr, mac macaddr, x xml, pt point, ts timestamp, tstz timestamptz, d date, o oid, f float8, fa float8[])"""


def test_a_snapshot_row_of_any_other_type_carries_what_a_change_carries(postgres: Postgres) -> None:
    """The types read as text on both sides (and char(n), whose cast to text drops the padding
    its output keeps: a snapshot read ``'ab'`` where the change carried ``'ab   '``), with their
    odd values (NaN, infinities, BC dates). Compared by ``repr``: NaN equals nothing."""

    rows, changes = asyncio.run(
        streamed_then_snapshotted(
            postgres,
            MORE_TYPES,
            "more",
            "INSERT INTO more VALUES (1, 1.1, '{1.1,16777215}', 7, 12.34, '1 day 02:03:04.5', '01:02:03.25', "
            "'01:02:03+02', 'NaN', 'Infinity', 'ab', '{x,yz}', B'1010', B'101', '10.0.0.1/8', '10.0.0.0/8', "
            "'08:00:2b:01:02:03', '<a/>', '(1,2)', 'infinity', '-infinity', 'infinity', 42, 'NaN', '{Infinity,-1.5}')",
            "INSERT INTO more (id, r, n, nn, c, ts, tstz, d, f) VALUES (2, 123456.79, 1.50, '-Infinity', "
            "'abcde', '2024-01-02 03:04:05', '2024-01-02 03:04:05+00', '0044-03-15 BC', '-Infinity')",
            "INSERT INTO more (id) VALUES (3)",
        )
    )
    assert [{k: repr(v) for k, v in r.items()} for r in rows] == [
        {k: repr(v) for k, v in r.items()} for r in changes
    ]
    assert (rows[0]["c"], rows[1]["c"], rows[2]["c"]) == ("ab   ", "abcde", None)
    # JSON has no NaN or infinity (orjson wrote null, a false NULL): PostgreSQL's text, both ways
    assert (rows[0]["f"], rows[0]["fa"], rows[1]["f"], rows[2]["f"]) == (
        "NaN",
        ["Infinity", -1.5],
        "-Infinity",
        None,
    )
    assert orjson.dumps(changes[0]["f"]) == b'"NaN"' and orjson.dumps(rows[0]["r"]) == b"1.1"


USER_TYPES = """CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE DOMAIN amount AS numeric(10,2) CHECK (VALUE > 0);
CREATE DOMAIN small AS int;
CREATE DOMAIN tiny AS small CHECK (VALUE < 100);
CREATE DOMAIN flags AS bool[];
CREATE DOMAIN doc AS jsonb;
CREATE DOMAIN day AS date;
CREATE TABLE typed (id int PRIMARY KEY, am amount, sm small, ti tiny, ams amount[], fl flags, dc doc, dy day,
    ms mood[], ips inet[], tms time[], prs pair[], bxs box[])"""


def test_a_domain_is_its_base_type_and_every_array_a_list(postgres: Postgres) -> None:
    """A column of a domain arrived as text (``'3.50'``, ``'5'``), a numeric's or an integer's
    value as a string, and an array of an enum, a domain or a type read as text (``inet``,
    ``time``, a composite) as the array's literal (``'{sad,happy}'``), where ``int[]`` is a
    list: the stream converted by the column's type OID, which for these is not a built-in one.
    Debezium types a domain by its base type and an array of any of them as an array. Now each
    is its base type's value and each array a list, snapshotted or streamed (``box[]``, whose
    elements are separated by ``;``, stays its text)."""

    rows, changes = asyncio.run(
        streamed_then_snapshotted(
            postgres,
            USER_TYPES,
            "typed",
            "INSERT INTO typed VALUES (1, 3.50, 5, 7, '{1.25,NULL}', '{t,f}', '{\"k\": [1]}', '2024-02-29', "
            "'{sad,happy}', '{10.0.0.1,::1/128}', '{01:02:03,NULL}', ARRAY[ROW(1, 'a b')::pair], '{(1,1),(0,0);(2,2),(1,1)}')",
            "INSERT INTO typed (id) VALUES (2)",
        )
    )
    assert rows == changes
    assert rows[0] == {
        "id": 1, "am": Decimal("3.50"), "sm": 5, "ti": 7, "ams": [Decimal("1.25"), None], "fl": [True, False],
        "dc": {"k": [1]}, "dy": date(2024, 2, 29), "ms": ["sad", "happy"], "ips": ["10.0.0.1", "::1"],
        "tms": ["01:02:03", None], "prs": ['(1,"a b")'], "bxs": "{(1,1),(0,0);(2,2),(1,1)}",
    }  # fmt: skip
    assert rows[1] == {"id": 2, **{c: None for c in rows[0] if c != "id"}}


@pytest.fixture
def postgres_past_int_oids() -> Iterator[Postgres]:
    """A cluster whose objects take oids past ``int``'s range (2^31): one that has made that many
    temporary tables, types or large objects over its life. An oid is an unsigned 32-bit number."""
    pg = Postgres().start()
    try:
        pg.set_next_oid(3_000_000_000)
        yield pg
    finally:
        pg.stop()


def test_tables_and_types_with_oids_past_int_snapshot_stream_and_have_partitions_watched(
    postgres_past_int_oids: Postgres,
) -> None:
    """A table's oid was read as ``oid::int``, negative past 2^31, and handed back as an ``oid``
    parameter, which asyncpg refuses (``value out of uint32 range``): no table of such a cluster
    could be snapshotted, and a partition attached to one could not be looked at."""
    pg = postgres_past_int_oids
    rows, changes = asyncio.run(
        streamed_then_snapshotted(
            pg, "CREATE DOMAIN small AS int; CREATE TABLE t (id int PRIMARY KEY, s small, ss small[])", "t",
            "INSERT INTO t VALUES (1, 5, '{6,NULL}')",
        )
    )  # fmt: skip
    assert rows == changes == [{"id": 1, "s": 5, "ss": [6, None]}]

    async def attached() -> list[Any]:
        db = await fresh_db(pg)
        conn = await asyncpg.connect(pg.dsn(db))
        await conn.execute("CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        await conn.execute("CREATE TABLE p0 PARTITION OF p FOR VALUES FROM (0) TO (10)")
        await conn.execute("CREATE TABLE loaded (id int PRIMARY KEY)")
        await conn.execute("INSERT INTO loaded VALUES (10)")
        assert await conn.fetchval("SELECT 'loaded'::regclass::oid::bigint") > 2**31
        src = source(pg, db, tables=["public.p"])
        await src.open(None)
        await src.watch.stop()  # asked by hand below
        try:
            await conn.execute("ALTER TABLE p ATTACH PARTITION loaded FOR VALUES FROM (10) TO (20)")
            with capture_logs() as logs:
                assert await src.watch._ask(src._conn) is None
        finally:
            await src.close()
            await conn.close()
        return [(e["event"], e["partitions"]) for e in logs if e["event"].startswith("captured_partition_")]

    assert asyncio.run(attached()) == [("captured_partition_attached", ["loaded"])]


def test_a_domain_over_char_keeps_its_padding_snapshotted_as_streamed(postgres: Postgres) -> None:
    """``char(n)``'s cast to text drops the padding its output (pgoutput's text) keeps, so the
    snapshot reads it through its output function; a domain over ``char(n)`` has an oid of its
    own and was cast: a snapshot row held ``'ab'`` where a change held ``'ab   '``. As the key, the
    row's two versions were two keys (a stale snapshot row could outlive a newer change, and a
    compacted topic kept both)."""
    rows, changes = asyncio.run(
        streamed_then_snapshotted(
            postgres,
            "CREATE DOMAIN code AS char(5); CREATE DOMAIN shortcode AS code;"
            "CREATE TABLE coded (c code PRIMARY KEY, s shortcode, cs code[])",
            "coded",
            "INSERT INTO coded VALUES ('ab', 'x', '{ab,NULL}')",
        )
    )
    assert rows == changes == [{"c": "ab   ", "s": "x    ", "cs": ["ab   ", None]}]
