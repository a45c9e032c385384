"""The SIGKILL scenario every sink test shares: a Turso workload, `serve` killed at random points.

Runs ``serve`` with the built-in workload writing to an embedded Turso database
and the given sink, kills it ``kills`` times (each time after the sink's
checkpoint has moved), then runs once more without the workload until the
checkpoint reaches the last change and stops it gracefully. Returns the
changes the database recorded (change_id, rowid), for the test to compare with
what the sink holds.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import stored_checkpoint, wait_until_sync
from tests.serve_proc import Serve
from tests.test_crash import read_cdc


def crash_and_recover(
    tmp_path: Path, sink: dict[str, Any], env: dict[str, str], kills: int = 5, seed: int = 1
) -> list[list[int]]:
    doc: dict[str, Any] = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "crash", "tenant": "t"},
        "spec": {
            "source": {
                "type": "turso",
                "config": {
                    "id": "db",
                    "path": str(tmp_path / "app.db"),
                    "workload": {"enabled": True, "rows_per_second": 400},
                },
            },
            "sinks": [sink],
            "batch": {"max_events": 50, "max_ms": 20},
            "storage": {"type": "sqlite", "path": str(tmp_path / "cp.db")},
        },
    }
    with_workload = tmp_path / "with.yaml"
    with_workload.write_text(yaml.safe_dump(doc))
    doc["spec"]["source"]["config"]["workload"]["enabled"] = False
    without = tmp_path / "without.yaml"
    without.write_text(yaml.safe_dump(doc))
    key = f"db::sink::{sink['config']['id']}"
    cp_db = tmp_path / "cp.db"
    rng = random.Random(seed)
    for _ in range(kills):
        before = stored_checkpoint(cp_db, key)
        with Serve(tmp_path, "--config", str(with_workload), api=False, env=env) as serve:
            wait_until_sync(
                lambda: stored_checkpoint(cp_db, key) != before,  # noqa: B023
                timeout=30,
                what="checkpoint progress",
            )
            time.sleep(rng.uniform(0, 0.4))
            serve.kill()
    changes, last = read_cdc(tmp_path / "app.db")
    with Serve(tmp_path, "--config", str(without), api=False, env=env) as serve:

        def caught_up() -> bool:
            cp = stored_checkpoint(cp_db, key)
            return cp is not None and int(cp["change_id"]) >= last

        wait_until_sync(caught_up, timeout=60, what="caught up")
        assert serve.terminate() == 0
    return changes
