"""What a snapshot shows: its status (API, metrics) and the progress bar serve draws on a terminal."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from deltaforge.snapshot.progress import SnapshotState
from deltaforge.snapshot.status import SnapshotStatus, WindowWaits
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


def test_a_window_wait_over_the_threshold_is_said_then_at_each_doubling_then_when_back() -> None:
    waits = WindowWaits(warn_s=10.0)
    said = [waits.seen(s) for s in (0.5, 10.0, 10.5, 19.0, 21.0, 30.0, 43.0, 9.0, 2.0, 11.0)]
    assert said == [None, None, "behind", None, "behind", None, "behind", "caught_up", None, "behind"]
    assert (waits.last_s, waits.max_s) == (11.0, 43.0)
    assert waits.to_dict() == {"window_wait_ms": 11000.0, "window_wait_max_ms": 43000.0}


def test_the_status_shows_the_windows_waits_and_a_new_snapshot_starts_them_afresh() -> None:
    status = SnapshotStatus()
    status.waits.warn_s = 0.5
    status.follow(state(0, ["public.items"]))
    assert status.to_dict()["current"]["window_wait_ms"] is None  # no window closed yet
    assert status.waits.seen(0.25) is None and status.waits.seen(0.75) == "behind"
    current = status.to_dict()["current"]
    assert (current["window_wait_ms"], current["window_wait_max_ms"]) == (750.0, 750.0)
    status.end(state(2000, []))
    assert status.to_dict()["finished"][0]["window_wait_max_ms"] == 750.0
    status.follow(SnapshotState("s2", "incremental", ["public.items"]))
    assert (status.waits.warn_s, status.waits.last_s, status.waits.max_s) == (0.5, None, 0.0)
    assert status.waits.seen(0.75) == "behind"  # said again: a new snapshot


def test_a_table_read_past_its_estimate_has_no_eta_and_an_open_ended_bar() -> None:
    """A table that grew since the server's estimate (or had none) showed an ETA of 0 s and a
    full bar while it went on being read: how long is unknown, and said so."""
    status = SnapshotStatus()
    status.follow(state(0, ["public.items", "public.other"]))
    items = status.tables["public.items"]
    items.started_at, items.rows_this_run = 100.0, 3000
    status.follow(state(3000, ["public.items", "public.other"]))
    assert items.to_dict(now=110.0) == {
        "rows": 3000, "estimate": 3000, "done": False, "rows_per_s": 300.0, "eta_s": None
    }  # fmt: skip
    runner: Any = SimpleNamespace(ctx=SimpleNamespace(snapshot=status))
    out = io.StringIO()
    bars = SnapshotProgress({"shop": runner}, Console(file=out, width=120, color_system=None))
    bars.update()
    bars.progress.console.print(bars.progress.get_renderable())
    assert "3000/?" in out.getvalue()
