"""Supervisors: strategies, restart types, intensity, escalation, Fatal."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from supervision import (
    ChildSpec,
    FakeClock,
    Fatal,
    Intensity,
    Restart,
    Strategy,
    Supervisor,
    SupervisorFailed,
)
from tests.helpers import wait_until
from tests.supervision_kit import NO_BACKOFF, Flaky, Probe, probe_tree, wait_started


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (Strategy.ONE_FOR_ONE, [("stop", "b"), ("start", "b")]),
        (
            Strategy.ONE_FOR_ALL,
            [("stop", "b"), ("stop", "c"), ("stop", "a"), ("start", "a"), ("start", "b"), ("start", "c")],
        ),
        (Strategy.REST_FOR_ONE, [("stop", "b"), ("stop", "c"), ("start", "b"), ("start", "c")]),
    ],
)
async def test_strategy_restarts_exactly_the_right_children_in_start_order(
    strategy: Strategy, expected: list[tuple[str, str]]
) -> None:
    sup, probes, log = probe_tree(strategy)
    task = asyncio.create_task(sup.run())
    await wait_started(sup, log, 3)
    assert log == [("start", "a"), ("start", "b"), ("start", "c")]
    log.clear()
    probes["b"].commands.put_nowait("fail")
    await wait_until(lambda: len(log) >= len(expected), what="restarts")
    await asyncio.sleep(0.05)
    assert log == expected
    snap = sup.snapshot()
    restarted = {c.name for c in snap.children if c.restarts == 1}
    assert restarted == {n for kind, n in expected if kind == "start"}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(
    ("restart", "command", "restarted"),
    [
        (Restart.PERMANENT, "exit", True),
        (Restart.PERMANENT, "fail", True),
        (Restart.TRANSIENT, "exit", False),
        (Restart.TRANSIENT, "fail", True),
        (Restart.TEMPORARY, "exit", False),
        (Restart.TEMPORARY, "fail", False),
    ],
)
async def test_restart_types(restart: Restart, command: str, restarted: bool) -> None:
    sup, probes, log = probe_tree(Strategy.ONE_FOR_ONE, restart=restart, names=("a", "keep"))
    task = asyncio.create_task(sup.run())
    await wait_started(sup, log, 2)
    probes["a"].commands.put_nowait(command)
    await wait_until(lambda: ("stop", "a") in log, what="a stopped")
    await asyncio.sleep(0.05)
    starts = [e for e in log if e == ("start", "a")]
    assert len(starts) == (2 if restarted else 1)
    assert sup.snapshot().find("a").restarts == (1 if restarted else 0)  # type: ignore[union-attr]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_supervisor_returns_when_no_child_is_left() -> None:
    sup, probes, log = probe_tree(Strategy.ONE_FOR_ONE, restart=Restart.TRANSIENT, names=("a",))
    task = asyncio.create_task(sup.run())
    await wait_started(sup, log, 1)
    probes["a"].commands.put_nowait("exit")
    await asyncio.wait_for(task, 5)
    assert sup.state == "stopped"


def _expected_failure_index(times: list[float], max_restarts: int, within: float) -> int | None:
    """Reference model: the first failure with more than max_restarts in its window."""
    for i, t in enumerate(times):
        in_window = [u for u in times[: i + 1] if u > t - within]
        if len(in_window) > max_restarts:
            return i
    return None


@settings(max_examples=60, deadline=None)
@given(
    max_restarts=st.integers(min_value=0, max_value=4),
    within=st.floats(min_value=0.5, max_value=20),
    gaps=st.lists(st.floats(min_value=0.0, max_value=15), min_size=1, max_size=12),
)
def test_intensity_property_over_random_failure_schedules(
    max_restarts: int, within: float, gaps: list[float]
) -> None:
    times: list[float] = []
    t = 0.0
    for g in gaps:
        t += g
        times.append(t)
    expected = _expected_failure_index(times, max_restarts, within)

    async def scenario() -> tuple[bool, int, Supervisor]:
        clock = FakeClock()
        flaky = Flaky("worker", clock, times)
        inner = Supervisor(
            "inner",
            [ChildSpec(flaky)],
            intensity=Intensity(max_restarts, within),
            backoff=NO_BACKOFF,
            clock=clock,
        )
        outer = Supervisor(
            "outer", [ChildSpec(inner)], intensity=Intensity(0, 1), backoff=NO_BACKOFF, clock=clock
        )
        task = asyncio.create_task(outer.run())
        calm = asyncio.create_task(flaky.exhausted.wait())
        done, _ = await asyncio.wait({task, calm}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        calm.cancel()
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False, flaky.failures, outer
        with pytest.raises(SupervisorFailed) as info:
            task.result()
        # The parent saw the child supervisor fail and (with no allowance) failed too.
        assert info.value.supervisor == "outer"
        assert isinstance(info.value.cause, SupervisorFailed)
        assert info.value.cause.supervisor == "inner"
        return True, flaky.failures, outer

    failed, failures, outer = asyncio.run(scenario())
    if expected is None:
        assert not failed
        assert failures == len(times)
    else:
        assert failed
        assert failures == expected + 1
        snap = outer.snapshot()
        assert snap.state == "failed"
        assert snap.children[0].state == "failed"


async def test_escalation_is_restarted_by_parent_and_logged() -> None:
    log: list[tuple[str, str]] = []
    probe = Probe("w", log)
    inner = Supervisor("inner", [ChildSpec(probe)], intensity=Intensity(0, 60), backoff=NO_BACKOFF)
    outer = Supervisor("outer", [ChildSpec(inner)], intensity=Intensity(5, 60), backoff=NO_BACKOFF)
    with capture_logs() as logs:
        task = asyncio.create_task(outer.run())
        await wait_until(lambda: probe.running, what="w running")
        probe.commands.put_nowait("fail")
        await wait_until(lambda: log.count(("start", "w")) == 2, what="restarted by parent")
    esc = [e for e in logs if e["event"] == "supervisor_escalated"]
    assert esc and esc[0]["supervisor"] == "inner" and esc[0]["actor"] == "w"
    assert "RuntimeError: w failed" in esc[0]["reason"]
    restarted = [e for e in logs if e["event"] == "child_restarted" and e["supervisor"] == "outer"]
    assert restarted and restarted[0]["actor"] == "inner"
    assert outer.snapshot().find("inner").restarts == 1  # type: ignore[union-attr]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_fatal_stops_the_subtree_without_restart_and_keeps_reason() -> None:
    log: list[tuple[str, str]] = []
    a, b = Probe("a", log), Probe("b", log)
    inner = Supervisor("inner", [ChildSpec(a), ChildSpec(b)], backoff=NO_BACKOFF)
    other = Probe("other", log)
    outer = Supervisor(
        "outer", [ChildSpec(other), ChildSpec(inner)], intensity=Intensity(100, 60), backoff=NO_BACKOFF
    )
    with capture_logs() as logs:
        task = asyncio.create_task(outer.run())
        await wait_until(lambda: a.running and b.running and other.running, what="all running")
        b.commands.put_nowait("fatal")
        with pytest.raises(Fatal, match="b: position lost"):
            await asyncio.wait_for(task, 5)
    assert log.count(("start", "b")) == 1
    assert not (a.running or b.running or other.running)
    snap = outer.snapshot()
    assert snap.state == "fatal" and snap.last_error == "fatal: b: position lost"
    assert snap.find("b").state == "fatal"  # type: ignore[union-attr]
    assert snap.find("b").last_error == "fatal: b: position lost"  # type: ignore[union-attr]
    fatal_logs = [e for e in logs if e["event"] == "child_fatal"]
    assert {e["supervisor"] for e in fatal_logs} == {"inner", "outer"}
    assert all(e["reason"] == "b: position lost" for e in fatal_logs)
    assert not [e for e in logs if e["event"] == "child_restarted"]


async def test_escalation_chains_the_failure_that_caused_it() -> None:
    sup, probes, log = probe_tree(Strategy.ONE_FOR_ONE, names=("a",), intensity=Intensity(0, 60))
    task = asyncio.create_task(sup.run())
    await wait_started(sup, log, 1)
    probes["a"].commands.put_nowait("fail")
    with pytest.raises(SupervisorFailed) as info:
        await task
    assert isinstance(info.value.__cause__, RuntimeError) and str(info.value.__cause__) == "a failed"
