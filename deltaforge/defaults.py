"""The built-in default pipeline: embedded Turso, a demo workload, file + stdout sinks."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def default_pipeline(data_dir: str | Path = "./data", workload: bool = True) -> dict[str, Any]:
    """The document ``serve`` runs when no ``--config`` is given.

    Everything lives under ``data_dir``: the Turso database ``demo.db`` (with a
    small built-in workload writing to it unless ``workload`` is false), the
    sink file ``events.jsonl`` and the checkpoints in ``deltaforge.db``.
    """
    d = Path(data_dir)
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "demo", "tenant": "default"},
        "spec": {
            "source": {
                "type": "turso",
                "config": {
                    "id": "demo",
                    "path": str(d / "demo.db"),
                    "workload": {"enabled": workload, "rows_per_second": 20},
                },
            },
            "sinks": [
                {"type": "file", "config": {"id": "events-file", "path": str(d / "events.jsonl")}},
                {"type": "stdout", "config": {"id": "console", "format": "pretty", "required": False}},
            ],
            "batch": {"max_events": 2000, "max_ms": 100},
            "storage": {"type": "sqlite", "path": str(d / "deltaforge.db")},
        },
    }
