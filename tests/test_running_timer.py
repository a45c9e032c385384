"""The "unanswered for 30 s" watches count only the time ``serve`` ran (runningtimer.py), on a
fake clock: what a pause of the whole process looks like to a timer is the clock moving on
with nothing run meanwhile."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from deltaforge.pipeline.runningtimer import RunningTimer


class FakeHandle:
    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.callback, self.args, self.cancelled = callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """``time`` and ``call_later`` of an event loop whose clock moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, int, FakeHandle]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> FakeHandle:
        handle = FakeHandle(callback, args)
        heapq.heappush(self.due, (self.now + delay, id(handle), handle))
        return handle

    def run_for(self, seconds: float) -> None:
        """The loop running: each timer called when due, in order."""
        end = self.now + seconds
        while self.due and self.due[0][0] <= end:
            when, _, handle = heapq.heappop(self.due)
            self.now = max(self.now, when)
            if not handle.cancelled:
                handle.callback(*handle.args)
        self.now = end

    def pause(self, seconds: float) -> None:
        """The whole process stopped: the clock moves on and nothing runs."""
        self.now += seconds


def test_a_running_timer_fires_once_its_delay_has_run() -> None:
    loop, fired = FakeLoop(), []
    RunningTimer(loop, 30.0, fired.append, "due")
    loop.run_for(29.9)
    assert fired == []
    loop.run_for(0.2)
    assert fired == ["due"]


def test_a_pause_of_the_whole_process_does_not_count() -> None:
    """Paused past its delay, a plain ``call_later`` is due the moment the loop runs again, before
    the answer it watches for (seed 3402's serve_paused: a sink listed unanswered for 4 ms). The
    running timer counts the late step as one step and still has the rest of its delay to go."""
    loop, plain, running = FakeLoop(), [], []
    loop.call_later(30.0, plain.append, "due")
    timer = RunningTimer(loop, 30.0, running.append, "due")
    loop.run_for(10.0)
    loop.pause(70.0)
    loop.run_for(0.001)  # the first moment the loop runs again
    assert plain == ["due"]
    assert running == [] and not timer.cancelled()
    loop.run_for(18.0)  # 10 + 1 (the late step) + 18 s of running: 29
    assert running == []
    loop.run_for(1.5)
    assert running == ["due"]


def test_a_loop_late_by_less_than_a_stall_still_counts_its_time() -> None:
    """A busy loop (a collector's pause, a slow callback) is not a paused process: the time counts."""
    loop, fired = FakeLoop(), []
    RunningTimer(loop, 30.0, fired.append, "due")
    loop.run_for(10.0)
    loop.pause(4.0)  # under STALL_S
    loop.run_for(16.1)
    assert fired == ["due"]


def test_a_cancelled_running_timer_never_fires() -> None:
    loop, fired = FakeLoop(), []
    timer = RunningTimer(loop, 30.0, fired.append, "due")
    loop.run_for(10.0)
    timer.cancel()
    loop.run_for(60.0)
    assert fired == [] and timer.cancelled()
