"""The scenarios every sink test shares: SIGKILLs of ``serve``, and its sink's server stopped.

The SIGKILL scenario: a Turso workload, `serve` killed at random points.

Runs ``serve`` with the built-in workload writing to an embedded Turso database
and the given sink, kills it ``kills`` times (each time after the sink's
checkpoint has moved), then runs once more without the workload until the
checkpoint reaches the last change and stops it gracefully. Returns the
changes the database recorded (change_id, rowid), for the test to compare with
what the sink holds.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import jsonl, stored_checkpoint, wait_until_sync
from tests.serve_proc import Serve
from tests.test_crash import read_cdc

OUTAGE_S = float(os.environ.get("DF_OUTAGE_S", "60"))


def _pipeline_files(tmp_path: Path, sink: dict[str, Any]) -> tuple[Path, Path]:
    """The shared Turso-with-workload pipeline, with and without the workload running."""
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
    return with_workload, without


def _catch_up(tmp_path: Path, without: Path, key: str, env: dict[str, str]) -> list[list[int]]:
    """Run without the workload until the sink's checkpoint holds the last change; the changes."""
    changes, last = read_cdc(tmp_path / "app.db")
    cp_db = tmp_path / "cp.db"
    with Serve(tmp_path, "--config", str(without), env=env) as serve:
        # Up first: the checkpoint may already hold the last change (the last kill came after it),
        # and a SIGTERM during start-up, before serve handles signals, ends it with -15.
        serve.wait_api()
        serve.wait_source_open("crash")

        def caught_up() -> bool:
            cp = stored_checkpoint(cp_db, key)
            return cp is not None and int(cp["change_id"]) >= last

        wait_until_sync(caught_up, timeout=120, what="caught up")
        assert serve.terminate() == 0
    return changes


def outage_and_recover(
    tmp_path: Path,
    sink: dict[str, Any],
    env: dict[str, str],
    halt: Callable[[], None],
    resume: Callable[[], None],
) -> list[list[int]]:
    """The sink's server stops for OUTAGE_S while ``serve`` runs with the workload (and the
    default restart policy): ``/health`` must say degraded naming the sink, the pipeline must
    keep running and recover by itself once the server is back. Returns the changes the
    database recorded, for the test to compare with what the sink holds."""
    with_workload, without = _pipeline_files(tmp_path, sink)
    sid = sink["config"]["id"]
    key = f"db::sink::{sid}"
    cp_db = tmp_path / "cp.db"
    with Serve(
        tmp_path, "--config", str(with_workload), "--log-file", str(tmp_path / "log.jsonl"), env=env
    ) as serve:
        serve.wait_api()
        wait_until_sync(lambda: stored_checkpoint(cp_db, key) is not None, timeout=30, what="a checkpoint")
        halt()
        down_at = time.monotonic()

        def degraded() -> bool:
            body = serve.get("/health").json()
            return body["status"] == "degraded" and f"sink:{sid}" in body["unavailable"].get("crash", {})

        wait_until_sync(degraded, timeout=60, what="/health degraded")
        assert serve.get("/ready").status_code == 503
        # The outage itself: the server stays down this long, whatever the pipeline does.
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert serve.get("/pipelines/crash").json()["state"] == "running"
        held = stored_checkpoint(cp_db, key)
        resume()
        wait_until_sync(
            lambda: stored_checkpoint(cp_db, key) != held, timeout=120, what="progress after the outage"
        )
        wait_until_sync(lambda: serve.get("/health").json()["status"] == "ok", timeout=60, what="/health ok")
        assert serve.terminate() == 0
    return _catch_up(tmp_path, without, key, env)


def silenced_and_recover(
    tmp_path: Path, sink: dict[str, Any], env: dict[str, str], silence: Callable[[], None]
) -> tuple[list[list[int]], str]:
    """The sink's open connections go silent for good (``silence``: its server's host vanished,
    or a NAT forgot them; new connections pass) while ``serve`` runs with the workload: the sink
    must say so and go on over new ones by itself, its checkpoint moving again. Returns the
    changes the database recorded, for the test to compare with what the sink holds, and what
    the sink said was wrong."""
    with_workload, without = _pipeline_files(tmp_path, sink)
    sid = sink["config"]["id"]
    key = f"db::sink::{sid}"
    cp_db, log = tmp_path / "cp.db", tmp_path / "log.jsonl"
    with Serve(tmp_path, "--config", str(with_workload), "--log-file", str(log), env=env) as serve:
        serve.wait_api()
        wait_until_sync(lambda: stored_checkpoint(cp_db, key) is not None, timeout=30, what="a checkpoint")
        silence()

        def said() -> dict[str, Any] | None:
            return next(
                (r for r in jsonl(log) if r["event"] == "unavailable" and r["what"] == f"sink:{sid}"), None
            )

        wait_until_sync(lambda: said() is not None, timeout=60, what="the silent connection said")
        held = stored_checkpoint(cp_db, key)
        wait_until_sync(
            lambda: stored_checkpoint(cp_db, key) != held, timeout=60, what="progress over a new connection"
        )
        assert serve.get("/pipelines/crash").json()["state"] == "running"
        assert serve.terminate() == 0
    record = said()
    assert record is not None
    return _catch_up(tmp_path, without, key, env), str(record["reason"])


def crash_and_recover(
    tmp_path: Path, sink: dict[str, Any], env: dict[str, str], kills: int = 5, seed: int = 1
) -> list[list[int]]:
    with_workload, without = _pipeline_files(tmp_path, sink)
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
    return _catch_up(tmp_path, without, key, env)
