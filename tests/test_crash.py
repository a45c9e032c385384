"""Checkpoint-after-ack under SIGKILL: a real serve process killed 20 times mid-workload."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml

from tests.helpers import first_occurrences, jsonl, stored_checkpoint, wait_until_sync
from tests.serve_proc import Serve

KILLS = 20


def config(tmp: Path, workload: bool) -> Path:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "crash", "tenant": "t"},
        "spec": {
            "source": {
                "type": "turso",
                "config": {
                    "id": "db",
                    "path": str(tmp / "app.db"),
                    "workload": {"enabled": workload, "rows_per_second": 400},
                },
            },
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
            "batch": {"max_events": 50, "max_ms": 20},
            "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
        },
    }
    path = tmp / ("with.yaml" if workload else "without.yaml")
    path.write_text(yaml.safe_dump(doc))
    return path


sink_lines = jsonl


def checkpoint(cp_db: Path) -> int:
    cp = stored_checkpoint(cp_db, "db::sink::f")
    return int(cp["change_id"]) if cp else 0


READ_CDC = """
import sys, orjson, turso
conn = turso.connect(sys.argv[1])
rows = conn.execute(
    "SELECT change_id, id FROM turso_cdc WHERE change_type != 2 AND table_name = 'orders' ORDER BY change_id"
).fetchall()
last = conn.execute("SELECT max(change_id) FROM turso_cdc").fetchone()[0]
sys.stdout.buffer.write(orjson.dumps({"rows": rows, "last": last}))
"""


def read_cdc(db: Path) -> tuple[list[list[int]], int]:
    out = subprocess.run(
        [sys.executable, "-c", READ_CDC, str(db)], capture_output=True, check=True, timeout=60
    )
    doc = orjson.loads(out.stdout)
    return doc["rows"], int(doc["last"])


@pytest.mark.slow
def test_sigkill_at_random_points_loses_nothing_and_keeps_row_order(tmp_path: Path) -> None:
    rng = random.Random(20261125)
    out = tmp_path / "events.jsonl"
    with_wl = config(tmp_path, workload=True)
    for _ in range(KILLS):
        before = len(sink_lines(out))
        with Serve(tmp_path, "--config", str(with_wl), api=False) as serve:
            wait_until_sync(lambda: len(sink_lines(out)) > before, timeout=20, what="new deliveries")  # noqa: B023
            time.sleep(rng.uniform(0.0, 0.5))
            serve.kill()

    # Everything the source committed, read from the database itself (in a child process:
    # pyturso keeps the file locked for the rest of the process that opened it).
    rows, last_change = read_cdc(tmp_path / "app.db")
    written = [int(r[0]) for r in rows]
    row_of = {int(r[0]): int(r[1]) for r in rows}
    assert len(written) > 200

    # Restart without the workload and let it catch up, then stop gracefully.
    with Serve(tmp_path, "--config", str(config(tmp_path, workload=False)), api=False) as serve:
        wait_until_sync(lambda: checkpoint(tmp_path / "cp.db") >= last_change, timeout=60, what="caught up")
        assert serve.terminate() == 0

    delivered = [int(d["source"]["change_id"]) for d in sink_lines(out)]  # type: ignore[index]
    assert set(written) <= set(delivered), f"missing: {sorted(set(written) - set(delivered))[:20]}"
    # In source order once duplicates (replays of unacknowledged batches) are set aside.
    first = first_occurrences(delivered)
    assert first == sorted(first)
    # Per row, every delivery (duplicates included) moves forward except when a replay restarts it.
    by_row: dict[int, list[int]] = {}
    for cid in first:
        by_row.setdefault(row_of[cid], []).append(cid)
    assert all(seq == sorted(seq) for seq in by_row.values())
    # Replays carry the same idempotency key as the original delivery.
    keys: dict[int, str] = {}
    for d in sink_lines(out):
        cid = int(d["source"]["change_id"])  # type: ignore[index]
        assert keys.setdefault(cid, str(d["idempotency_key"])) == d["idempotency_key"]
