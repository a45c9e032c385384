"""Snapshots from MariaDB through ``serve``: the handoff to streaming, proven under writes and SIGKILL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import jsonl, stored_checkpoint, wait_until_sync
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.mariadb import CDC_USER, MariaDB
from tests.snapshot_kit import (
    Execute,
    Writer,
    check_handoff,
    kill_points,
    snapshot_done,
    snapshot_rows_in,
    snapshot_status,
)
from tests.test_mysql_source import fresh_db

ROWS = 200_000


def spec(tmp: Path, server: MariaDB, db: str, **snapshot: Any) -> dict[str, Any]:
    return {
        "source": {
            "type": "mysql",
            "config": {
                "id": "my",
                "dsn": server.dsn(db),
                "tables": [f"{db}.items"],
                "snapshot": {"mode": "initial", "chunk_size": 5000, **snapshot},
            },
        },
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
        "batch": {"max_events": 2000, "max_ms": 20},
        "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
    }


def prepare(server: MariaDB, rows: int) -> str:
    db = fresh_db(server)
    with server.root(db) as c, c.cursor() as cur:
        # The signal table lives in the captured database: the CDC user creates and writes it.
        cur.execute(f"GRANT CREATE, INSERT, UPDATE ON {db}.* TO '{CDC_USER}'@'%'")
        cur.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL, payload varchar(64))")
        cur.execute(f"INSERT INTO items SELECT seq, seq, repeat('x', 40) FROM seq_1_to_{rows}")
        cur.execute("ANALYZE TABLE items")
    return db


def writer(server: MariaDB, db: str, rows: int, seed: int) -> Writer:
    def connect() -> tuple[Execute, Any]:
        conn = server.root(db)
        cur = conn.cursor()
        return (lambda sql, args: cur.execute(sql, args)), conn.close

    return Writer(connect, rows, seed)


def table_state(server: MariaDB, db: str) -> dict[int, int]:
    with server.root(db) as c, c.cursor() as cur:
        cur.execute("SELECT id, v FROM items")
        return {int(i): int(v) for i, v in cur.fetchall()}


def caught_up(tmp: Path, server: MariaDB) -> bool:
    cp = stored_checkpoint(tmp / "cp.db", "my::sink::f")
    return cp is not None and cp.get("gtid") == server.gtid_binlog_pos()


def finish(serve: Serve, tmp: Path, server: MariaDB, work: Writer) -> None:
    """Until the snapshot is done; then stop writing and wait until the sink has everything."""
    try:
        wait_until_sync(lambda: snapshot_done(serve), timeout=300, what="snapshot finished")
    finally:
        work.stop.set()
        work.join(10)
    assert work.error is None, work.error
    wait_until_sync(lambda: caught_up(tmp, server), timeout=120, what="sink caught up")


def test_snapshot_under_writes_hands_off_to_streaming_without_gaps_or_stale_rows(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    db = prepare(mariadb, ROWS)
    work = writer(mariadb, db, ROWS, seed=3)
    with serve_pipeline(tmp_path, spec(tmp_path, mariadb, db)) as serve:
        work.start()
        finish(serve, tmp_path, mariadb, work)
        status = snapshot_status(serve)
        assert serve.terminate() == 0
    assert min(work.ops.values()) > 0, work.ops  # every kind of write happened during the snapshot
    snapshot_rows = check_handoff(tmp_path / "events.jsonl", table_state(mariadb, db), crashes=False)
    assert 0 < snapshot_rows <= ROWS + work.ops["insert"] + work.ops["move"]
    assert status["finished"][0]["tables"][f"{db}.items"]["done"] is True
    # Watermarks and signal rows are never delivered.
    assert {d["source"]["table"] for d in jsonl(tmp_path / "events.jsonl")} == {"items"}


@pytest.mark.slow
def test_snapshot_killed_mid_way_resumes_from_the_next_chunk(mariadb: MariaDB, tmp_path: Path) -> None:
    db = prepare(mariadb, ROWS)
    doc = spec(tmp_path, mariadb, db)
    out = tmp_path / "events.jsonl"
    work = writer(mariadb, db, ROWS, seed=4)
    kills = 3
    try:
        for n, at in enumerate(kill_points(seed=7, rows=ROWS, kills=kills)):
            with serve_pipeline(tmp_path, doc) as serve:
                if n == 0:
                    work.start()
                wait_until_sync(lambda: snapshot_rows_in(out) >= at, timeout=120, what=f"{at} snapshot rows")  # noqa: B023
                serve.kill()
        with serve_pipeline(tmp_path, doc) as serve:
            finish(serve, tmp_path, mariadb, work)
            assert serve.terminate() == 0
    finally:
        work.stop.set()
    snapshot_rows = check_handoff(out, table_state(mariadb, db), crashes=True)
    assert snapshot_rows < ROWS + kills * 10 * 5000, snapshot_rows  # never the whole table again
