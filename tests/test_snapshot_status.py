"""What a snapshot shows: its status (API, metrics) and the progress bar serve draws on a terminal."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from deltaforge.snapshot.progress import SnapshotState
from deltaforge.snapshot.status import SnapshotStatus
from deltaforge.snapshot.terminal import SnapshotProgress


def state(rows: int, pending: list[str]) -> SnapshotState:
    return SnapshotState("s1", "initial", pending, rows={"public.items": rows, "public.other": 0},
                         estimates={"public.items": 2000, "public.other": 10})  # fmt: skip


def test_status_shows_rows_estimate_rate_and_eta_per_table() -> None:
    status = SnapshotStatus()
    status.follow(state(0, ["public.items", "public.other"]))
    items = status.tables["public.items"]
    items.started_at = 100.0
    items.rows_this_run = 500
    status.follow(state(500, ["public.items", "public.other"]))
    now_view = items.to_dict(now=110.0)
    assert now_view == {"rows": 500, "estimate": 2000, "done": False, "rows_per_s": 50.0, "eta_s": 30.0}
    status.follow(state(2000, ["public.other"]))
    assert status.to_dict()["current"]["tables"]["public.items"]["done"] is True
    status.end(state(2000, []))
    shown = status.to_dict()
    assert shown["running"] is False and shown["current"] is None
    assert (
        shown["finished"][0]["id"] == "s1" and shown["finished"][0]["tables"]["public.items"]["rows"] == 2000
    )


def test_progress_bar_draws_a_line_per_table_of_running_snapshots() -> None:
    status = SnapshotStatus()
    status.follow(state(1000, ["public.items", "public.other"]))
    runner: Any = SimpleNamespace(ctx=SimpleNamespace(snapshot=status))
    idle: Any = SimpleNamespace(ctx=SimpleNamespace(snapshot=SnapshotStatus()))
    out = io.StringIO()
    bars = SnapshotProgress({"shop": runner, "idle": idle}, Console(file=out, width=120, color_system=None))
    assert bars.active
    bars.update()
    bars.progress.console.print(bars.progress.get_renderable())
    text = out.getvalue()
    assert "shop public.items" in text and "1000/2000" in text
    assert "shop public.other" in text and "0/10" in text
    assert "idle" not in text
