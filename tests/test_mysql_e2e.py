"""MariaDB → file through ``python -m deltaforge serve``: SIGKILL resume, position lost, a stopped decoder."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import first_occurrences, jsonl, stored_checkpoint, wait_until_sync
from tests.mysql_kit import fresh_db, purge_all_but_newest
from tests.serve_proc import Serve
from tests.servers.mariadb import CDC_PASSWORD, MariaDB
from tests.stopped_decoder import stopped_decoder_is_replaced


def pipeline_yaml(tmp: Path, db: str) -> Path:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "shop", "tenant": "acme"},
        "spec": {
            "source": {
                "type": "mysql",
                "config": {"id": "shop-my", "dsn": "${CDC_DSN}", "tables": [f"{db}.items"]},
            },
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
            "batch": {"max_events": 100, "max_ms": 20},
            "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
        },
    }
    path = tmp / "shop.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


sink_lines = jsonl


def checkpoint_gtid(cp_db: Path) -> str:
    cp = stored_checkpoint(cp_db, "shop-my::sink::f")
    return str(cp.get("gtid", "")) if cp else ""


class Workload(threading.Thread):
    """Inserts rows and bumps their version, one small transaction at a time."""

    def __init__(self, server: MariaDB, db: str) -> None:
        super().__init__(daemon=True)
        self.server, self.db = server, db
        self.stop = threading.Event()
        self.done: list[tuple[int, int]] = []  # (id, version) committed, in commit order
        self.rng = random.Random(4)

    def run(self) -> None:
        versions: dict[int, int] = {}
        with self.server.root(self.db) as c, c.cursor() as cur:
            while not self.stop.is_set():
                if not versions or self.rng.random() < 0.4:
                    rid = len(versions) + 1
                    versions[rid] = 1
                    cur.execute("INSERT INTO items VALUES (%s, 1, REPEAT('p', 40))", (rid,))
                else:
                    rid = self.rng.choice(list(versions))
                    versions[rid] += 1
                    cur.execute("UPDATE items SET version = %s WHERE id = %s", (versions[rid], rid))
                self.done.append((rid, versions[rid]))
                time.sleep(0.002)


@pytest.mark.slow
def test_sigkill_ten_times_loses_nothing_and_keeps_row_order(mariadb: MariaDB, tmp_path: Path) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY, version INT, payload VARCHAR(100))")
    cfg = pipeline_yaml(tmp_path, db)
    env = {"CDC_DSN": mariadb.dsn()}
    out = tmp_path / "events.jsonl"
    rng = random.Random(10)
    work = Workload(mariadb, db)
    work.start()
    try:
        for _ in range(10):
            before = len(sink_lines(out))
            with Serve(tmp_path, "--config", str(cfg), api=False, env=env) as serve:
                wait_until_sync(lambda: len(sink_lines(out)) > before, timeout=30, what="new deliveries")  # noqa: B023
                time.sleep(rng.uniform(0.0, 0.4))
                serve.kill()
    finally:
        work.stop.set()
        work.join(10)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        final_gtid = cur.fetchone()[0]
    with Serve(tmp_path, "--config", str(cfg), api=False, env=env) as serve:
        wait_until_sync(
            lambda: checkpoint_gtid(tmp_path / "cp.db") == final_gtid, timeout=60, what="caught up"
        )
        assert serve.terminate() == 0

    got = [(int(d["after"]["id"]), int(d["after"]["version"])) for d in sink_lines(out)]
    assert set(work.done) <= set(got), f"missing {sorted(set(work.done) - set(got))[:10]}"
    assert len(work.done) > 300
    assert first_occurrences(got) == work.done  # commit order, once replays are set aside
    logs = (tmp_path / "serve.err").read_text() + (tmp_path / "serve.out").read_text()
    assert CDC_PASSWORD not in logs  # credentials never appear in logs


def test_purged_binlog_halts_serve_with_503(mariadb: MariaDB, tmp_path: Path) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY, version INT, payload VARCHAR(100))")
        cur.execute("INSERT INTO items VALUES (1, 1, 'x')")
    cfg = pipeline_yaml(tmp_path, db)
    env = {"CDC_DSN": mariadb.dsn()}
    with Serve(tmp_path, "--config", str(cfg), env=env) as serve:
        wait_until_sync(lambda: checkpoint_gtid(tmp_path / "cp.db") != "", timeout=30, what="a checkpoint")
        assert serve.terminate() == 0
    stored = stored_checkpoint(tmp_path / "cp.db", "shop-my::sink::f")
    assert stored is not None
    file = stored["file"]
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO items VALUES (2, 1, 'lost')")  # lands in the file about to go
    purge_all_but_newest(mariadb, file)
    with Serve(tmp_path, "--config", str(cfg), env=env) as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/health").status_code == 503, timeout=30, what="503")
        [reason] = serve.get("/health").json()["reasons"]
        assert reason.startswith(f"shop: position lost: binlog file {file} is no longer on the server")
        assert reason.endswith("Re-snapshot required.")
        assert serve.terminate() == 0
    assert [d["after"]["id"] for d in sink_lines(tmp_path / "events.jsonl")] == [
        1
    ]  # nothing skipped silently


def test_a_stopped_binlog_decoder_is_replaced_and_nothing_is_lost(mariadb: MariaDB, tmp_path: Path) -> None:
    """The binlog decoder child stopped (SIGSTOP, a cgroup freezer) looked like a quiet server:
    nothing read, for ever, ``/health`` ok. Past the stream's 10 s bound plus 10 s the reader
    fails naming it and its restart starts another; the rows written meanwhile arrive."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")

    def write(first: int, last: int) -> None:
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s)", [(i,) for i in range(first, last + 1)])

    source = {"type": "mysql", "config": {"id": "my", "dsn": mariadb.dsn(db), "tables": [f"{db}.t"]}}
    stopped_decoder_is_replaced(tmp_path, source, write, bound_s=20)
