"""The "unanswered for 30 s" watches count only the time ``serve`` ran (runningtimer.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from deltaforge.pipeline.runningtimer import RunningTimer


def pause_this_process(seconds: float) -> None:
    """The event loop held: what a SIGSTOPped ``serve`` sees of the time it did not run."""
    time.sleep(seconds)  # the fault itself (the loop does nothing meanwhile), not a wait for an event


@pytest.mark.anyio
async def test_a_running_timer_fires_once_its_delay_has_run() -> None:
    fired = asyncio.Event()
    RunningTimer(asyncio.get_running_loop(), 0.2, fired.set, step=0.05, stall=0.25)
    await asyncio.wait_for(fired.wait(), 10)


@pytest.mark.anyio
async def test_a_pause_of_the_whole_process_does_not_count() -> None:
    """Paused past its delay, a plain ``call_later`` fires the moment the loop runs again, before
    the answer it watches for (seed 3402's serve_paused: a sink listed unanswered for 4 ms). The
    running timer still has all but one step of its delay to go."""
    loop = asyncio.get_running_loop()
    plain, running = asyncio.Event(), asyncio.Event()
    loop.call_later(0.3, plain.set)
    timer = RunningTimer(loop, 0.3, running.set, step=0.05, stall=0.25)
    pause_this_process(0.6)
    await asyncio.sleep(0.1)  # well under the 0.25 s of running it still lacks
    assert plain.is_set()
    assert not running.is_set() and not timer.cancelled()
    await asyncio.wait_for(running.wait(), 10)


@pytest.mark.anyio
async def test_a_cancelled_running_timer_never_fires() -> None:
    fired: list[str] = []
    timer = RunningTimer(asyncio.get_running_loop(), 0.1, fired.append, "fired", step=0.02)
    await asyncio.sleep(0.05)
    timer.cancel()
    done = asyncio.Event()
    RunningTimer(asyncio.get_running_loop(), 0.2, done.set, step=0.02)  # well past the first's due
    await asyncio.wait_for(done.wait(), 10)
    assert fired == [] and timer.cancelled()
