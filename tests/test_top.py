"""``deltaforge top`` under a pseudo-terminal against a running serve (issue 16, acceptance 5):
the screen holds the pipeline, a non-zero rate and the actor tree."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import on_terminal, wait_until_sync
from tests.serve_proc import Serve


def test_top_shows_the_pipeline_its_rate_and_its_tree(tmp_path: Path) -> None:
    with Serve(tmp_path, "--quiet") as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/pipelines/demo").json()["counters"]["events_read"] > 0,
                        what="events flowing")  # fmt: skip
        top, screen = on_terminal(
            [sys.executable, "-m", "deltaforge", "top", "--api", serve.url(""), "--interval", "0.5"], lines=60
        )
        rate = re.compile(r"running\s+([0-9,]+)\s+([0-9,]+)")

        def shows_a_rate() -> bool:
            return any(int(read.replace(",", "")) > 0 for read, _ in rate.findall(screen.read()))

        try:
            wait_until_sync(shows_a_rate, timeout=30, what="a frame with a rate")
        finally:
            top.terminate()
            top.wait(10)
            os.close(screen.leader)
        assert serve.terminate() == 0
    text = screen.text
    assert "demo" in text and "read/s" in text and "committed/s" in text
    for node in ("PipelineSupervisor[demo]", "SourceReader", "DeliveryWorker[events-file]", "Accumulator"):
        assert node in text, node
    assert re.search(r"\d+/\d+", text)  # a mailbox's fill
    assert "events-file" in text and "checkpoint age" in text


def test_top_says_when_the_api_is_not_there() -> None:
    proc = subprocess.run([sys.executable, "-m", "deltaforge", "top", "--api", "http://127.0.0.1:1", "--once"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "cannot reach the deltaforge API at http://127.0.0.1:1" in proc.stdout


def test_top_shows_a_pipeline_that_was_not_restored_as_failed(tmp_path: Path) -> None:
    """Such a pipeline has no counters and no tree (``test_lifecycle``): ``top`` raised KeyError."""
    doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "orders"},
           "spec": {"source": {"type": "turso", "config": {"id": "o", "path": str(tmp_path / "o.db")}},
                    "sinks": [{"type": "file", "config": {"id": "f", "path": "${DF_OUT_DIR}/e.jsonl"}}]}}  # fmt: skip
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pipelines.json").write_text(json.dumps({"orders": doc}))
    env = {k: v for k, v in os.environ.items() if k != "DF_OUT_DIR"}
    with Serve(tmp_path, "--quiet", "--no-workload", env=env) as serve:
        serve.wait_api()
        top = subprocess.run([sys.executable, "-m", "deltaforge", "top", "--api", serve.url(""), "--once"],
                             capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "200"})  # fmt: skip
        assert serve.terminate() == 0
    assert top.returncode == 0, top.stderr
    assert "orders" in top.stdout and "failed" in top.stdout and "not restored" in top.stdout
    assert "PipelineSupervisor[demo]" in top.stdout  # the others as before
