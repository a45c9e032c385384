"""Supervisors: strategies, restart types, intensity, Fatal, backoff, shutdown."""

from __future__ import annotations

import asyncio
import random

import anyio
import pytest
from anyio.abc import TaskStatus
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from actors import Actor, ActorCell, NodeSnapshot
from supervision import (
    Backoff,
    ChildSpec,
    FakeClock,
    Fatal,
    Intensity,
    Restart,
    Strategy,
    Supervisor,
    SupervisorFailed,
    Unavailable,
)
from tests.helpers import wait_until

NO_BACKOFF = Backoff(base=0.0, max=0.0)


class Probe:
    """A child driven by commands: 'fail', 'exit', 'fatal'."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name = name
        self.log = log
        self.commands: asyncio.Queue[str] = asyncio.Queue()
        self.running = False

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.log.append(("start", self.name))
        self.running = True
        task_status.started()
        try:
            cmd = await self.commands.get()
            if cmd == "fail":
                raise RuntimeError(f"{self.name} failed")
            if cmd == "fatal":
                raise Fatal(f"{self.name}: position lost")
        finally:
            self.running = False
            self.log.append(("stop", self.name))

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="probe", state="running" if self.running else "idle")


def _tree(
    strategy: Strategy,
    restart: Restart = Restart.PERMANENT,
    names: tuple[str, ...] = ("a", "b", "c"),
    intensity: Intensity | None = None,
) -> tuple[Supervisor, dict[str, Probe], list[tuple[str, str]]]:
    log: list[tuple[str, str]] = []
    probes = {n: Probe(n, log) for n in names}
    sup = Supervisor(
        "sup",
        [ChildSpec(p, restart=restart) for p in probes.values()],
        strategy=strategy,
        intensity=intensity or Intensity(10, 60),
        backoff=NO_BACKOFF,
    )
    return sup, probes, log


async def _started(sup: Supervisor, log: list[tuple[str, str]], count: int) -> None:
    await wait_until(lambda: sum(1 for e in log if e[0] == "start") >= count, what=f"{count} starts")


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
    sup, probes, log = _tree(strategy)
    task = asyncio.create_task(sup.run())
    await _started(sup, log, 3)
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
    sup, probes, log = _tree(Strategy.ONE_FOR_ONE, restart=restart, names=("a", "keep"))
    task = asyncio.create_task(sup.run())
    await _started(sup, log, 2)
    probes["a"].commands.put_nowait(command)
    await wait_until(lambda: ("stop", "a") in log, what="a stopped")
    await asyncio.sleep(0.05)
    starts = [e for e in log if e == ("start", "a")]
    assert len(starts) == (2 if restarted else 1)
    assert sup.snapshot().find("a").restarts == (1 if restarted else 0)  # type: ignore[union-attr]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_supervisor_returns_when_no_child_is_left() -> None:
    sup, probes, log = _tree(Strategy.ONE_FOR_ONE, restart=Restart.TRANSIENT, names=("a",))
    task = asyncio.create_task(sup.run())
    await _started(sup, log, 1)
    probes["a"].commands.put_nowait("exit")
    await asyncio.wait_for(task, 5)
    assert sup.state == "stopped"


class Flaky:
    """Fails at given fake-clock times, one failure per run."""

    def __init__(self, name: str, clock: FakeClock, times: list[float]) -> None:
        self.name = name
        self.clock = clock
        self.times = list(times)
        self.failures = 0
        self.exhausted = asyncio.Event()

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if not self.times:
            task_status.started()
            self.exhausted.set()
            await anyio.sleep_forever()
        self.clock.set(self.times.pop(0))
        self.failures += 1
        raise RuntimeError(f"failure {self.failures}")

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="flaky", state="x")


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


def test_backoff_grows_exponentially_to_the_max_with_jitter() -> None:
    b = Backoff(base=0.1, max=2.0)
    rng = random.Random(7)
    caps = [b.cap(n) for n in range(1, 9)]
    assert caps == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    delays = [b.delay(n, rng) for n in range(1, 9) for _ in range(50)]
    for n in range(1, 9):
        chunk = delays[(n - 1) * 50 : n * 50]
        assert all(b.cap(n) / 2 <= d <= b.cap(n) for d in chunk)
        assert len(set(chunk)) > 1  # jittered, not constant


async def test_supervisor_sleeps_growing_backoff_between_restarts() -> None:
    clock = FakeClock()
    flaky = Flaky("w", clock, [0.0, 0.0, 0.0, 0.0])
    sup = Supervisor(
        "s", [ChildSpec(flaky)], intensity=Intensity(10, 1000), backoff=Backoff(1.0, 5.0), clock=clock
    )
    task = asyncio.create_task(sup.run())
    await wait_until(lambda: len(clock.sleeps) == 4, what="4 backoffs")
    caps = [1.0, 2.0, 4.0, 5.0]
    for cap, slept in zip(caps, clock.sleeps, strict=True):
        assert cap / 2 <= slept <= cap
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_backoff_sleep_is_cancelled_cleanly_on_shutdown() -> None:
    log: list[tuple[str, str]] = []
    a, b = Probe("a", log), Probe("b", log)
    sup = Supervisor(
        "s", [ChildSpec(a), ChildSpec(b)], backoff=Backoff(base=3600, max=3600), intensity=Intensity(5, 60)
    )
    task = asyncio.create_task(sup.run())
    await wait_until(lambda: a.running and b.running, what="running")
    a.commands.put_nowait("fail")
    await wait_until(lambda: sup.snapshot().find("a").state == "restarting", what="in backoff")  # type: ignore[union-attr]
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 2)
    assert not b.running
    assert log.count(("start", "a")) == 1


async def test_shutdown_stops_children_in_reverse_order() -> None:
    sup, _probes, log = _tree(Strategy.ONE_FOR_ONE, names=("first", "second", "third"))
    task = asyncio.create_task(sup.run())
    await _started(sup, log, 3)
    sup.request_stop()
    await asyncio.wait_for(task, 5)
    assert [e for e in log if e[0] == "stop"] == [("stop", "third"), ("stop", "second"), ("stop", "first")]


class Stubborn:
    """Swallows cancellation and carries on for a second before it ends."""

    name = "stubborn"

    def __init__(self) -> None:
        self.started = False

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.started = True
        task_status.started()
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while deadline is None or loop.time() < deadline:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                deadline = deadline or loop.time() + 1.0

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="task", state="running")


async def test_child_ignoring_cancellation_is_reported_and_shutdown_completes() -> None:
    log: list[tuple[str, str]] = []
    stubborn = Stubborn()
    polite = Probe("polite", log)
    sup = Supervisor("s", [ChildSpec(polite), ChildSpec(stubborn, shutdown_timeout=0.1)], backoff=NO_BACKOFF)
    with capture_logs() as logs:
        task = asyncio.create_task(sup.run())
        await wait_until(lambda: stubborn.started and polite.running, what="started")
        sup.request_stop()
        await asyncio.wait_for(task, 3)
    assert ("stop", "polite") in log
    timeouts = [e for e in logs if e["event"] == "child_shutdown_timeout"]
    assert timeouts and timeouts[0]["actor"] == "stubborn" and timeouts[0]["supervisor"] == "s"
    assert sup.snapshot().find("stubborn").state == "abandoned"  # type: ignore[union-attr]


async def test_every_restart_is_logged_with_actor_supervisor_reason() -> None:
    sup, probes, log = _tree(Strategy.ONE_FOR_ONE, names=("a",))
    with capture_logs() as logs:
        task = asyncio.create_task(sup.run())
        await _started(sup, log, 1)
        probes["a"].commands.put_nowait("fail")
        await _started(sup, log, 2)
    ev = [e for e in logs if e["event"] == "child_restarted"]
    crash = ev[0].pop("exc_info")  # the failure itself, rendered with its traceback
    assert isinstance(crash, RuntimeError) and str(crash) == "a failed"
    assert ev == [
        {
            "event": "child_restarted",
            "actor": "a",
            "supervisor": "sup",
            "reason": "RuntimeError: a failed",
            "failed": "a",
            "restarts": 1,
            "delay_s": 0.0,
            "log_level": "warning",
        }
    ]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_actor_cells_under_a_supervisor_get_fresh_state_and_stable_refs() -> None:
    from typing import Any

    from actors import Actor, ActorCell

    class Counter(Actor):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        async def receive(self, message: Any) -> Any:
            if message == "crash":
                raise RuntimeError("crash")
            self.n += 1
            return self.n

    cell = ActorCell("counter", Counter)
    sup = Supervisor("s", [ChildSpec(cell)], backoff=NO_BACKOFF)
    task = asyncio.create_task(sup.run())
    ref = cell.ref
    assert await ref.ask("x") == 1
    assert await ref.ask("x") == 2
    with pytest.raises(RuntimeError):
        await ref.ask("crash")
    await wait_until(lambda: cell.state == "running" and cell.mailbox is not None, what="restarted")
    assert await ref.ask("x") == 1  # fresh instance, same ref
    snap = sup.snapshot().find("counter")
    assert snap is not None and snap.restarts == 1 and snap.mailbox_capacity == 16
    assert snap.last_error == "RuntimeError: crash"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_each_child_starts_only_after_the_one_before_it_is_up() -> None:
    """OTP's start_link: child N+1's on_start begins only after child N's on_start returned,
    and a supervisor reports itself up (``tg.start``) only once all its children are."""
    events: list[str] = []
    gate = anyio.Event()

    class First(Actor):
        async def on_start(self) -> None:
            events.append("first:begin")
            await gate.wait()
            events.append("first:end")

    class Second(Actor):
        async def on_start(self) -> None:
            events.append("second:begin")

    inner = Supervisor(
        "inner", [ChildSpec(ActorCell("first", First)), ChildSpec(ActorCell("second", Second))]
    )

    class Third(Actor):
        async def on_start(self) -> None:
            events.append("third:begin")

    top = Supervisor("top", [ChildSpec(inner), ChildSpec(ActorCell("third", Third))])
    up: list[str] = []

    async def start_top() -> None:
        async with anyio.create_task_group() as inner_tg:
            await inner_tg.start(top.run)
            up.append("top")
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(start_top)
        await anyio.wait_all_tasks_blocked()
        assert events == ["first:begin"]  # second (and so third) wait for first to be up
        assert up == []
        gate.set()
        await anyio.wait_all_tasks_blocked()
        assert events == ["first:begin", "first:end", "second:begin", "third:begin"]
        assert up == ["top"]
        tg.cancel_scope.cancel()


async def test_a_restart_starts_its_group_again_in_order() -> None:
    events: list[str] = []

    class Steady(Actor):
        async def on_start(self) -> None:
            events.append(f"{self.ref.name}:up")

        async def receive(self, message: object) -> object:
            raise RuntimeError("crash")

    a, b = ActorCell("a", Steady), ActorCell("b", Steady)
    sup = Supervisor("s", [ChildSpec(a), ChildSpec(b)], strategy=Strategy.ONE_FOR_ALL, backoff=NO_BACKOFF)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        assert events == ["a:up", "b:up"]
        with pytest.raises(RuntimeError):
            await a.ref.ask("boom")
        await wait_until(lambda: len(events) == 4, what="a and b restarted")
        assert events == ["a:up", "b:up", "a:up", "b:up"]
        sup.request_stop()


async def test_escalation_chains_the_failure_that_caused_it() -> None:
    sup, probes, log = _tree(Strategy.ONE_FOR_ONE, names=("a",), intensity=Intensity(0, 60))
    task = asyncio.create_task(sup.run())
    await _started(sup, log, 1)
    probes["a"].commands.put_nowait("fail")
    with pytest.raises(SupervisorFailed) as info:
        await task
    assert isinstance(info.value.__cause__, RuntimeError) and str(info.value.__cause__) == "a failed"


class Unreachable:
    """Exits with Unavailable ``outages`` times (its server is down), then stays up."""

    name = "reader"

    def __init__(self, outages: int) -> None:
        self.outages = outages
        self.attempts = 0
        self.up = asyncio.Event()

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.attempts += 1
        if self.attempts <= self.outages:
            raise Unavailable(f"connection refused (attempt {self.attempts})")
        task_status.started()
        self.up.set()
        await anyio.sleep_forever()

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="task", state="x")


async def test_unavailable_is_waited_for_with_capped_backoff_and_never_counts_as_a_crash() -> None:
    clock = FakeClock()
    child = Unreachable(outages=40)
    sup = Supervisor(
        "s", [ChildSpec(child)], intensity=Intensity(2, 60), backoff=Backoff(0.1, 5.0), clock=clock,
        rng=random.Random(1),
    )  # fmt: skip
    with capture_logs() as logs:
        task = asyncio.create_task(sup.run())
        await asyncio.wait_for(child.up.wait(), 10)
    assert child.attempts == 41  # 40 refusals with intensity 2: none of them counted
    assert len(clock.sleeps) == 40
    assert clock.sleeps[0] <= 0.1 and max(clock.sleeps) <= 5.0  # exponential, capped at backoff max
    assert all(2.5 <= d <= 5.0 for d in clock.sleeps[8:])
    unavailable = [e for e in logs if e["event"] == "child_unavailable"]
    assert len(unavailable) == 40 and unavailable[-1]["attempts"] == 40
    assert not [e for e in logs if e["event"] == "supervisor_escalated"]
    sup.request_stop()
    await task


async def test_max_unavailable_turns_a_long_outage_into_a_failure_naming_it() -> None:
    clock = FakeClock()
    child = Unreachable(outages=1000)
    sup = Supervisor(
        "s", [ChildSpec(child)], backoff=Backoff(1.0, 10.0), clock=clock, rng=random.Random(2),
        max_unavailable=120,
    )  # fmt: skip
    with pytest.raises(SupervisorFailed) as info:
        await asyncio.wait_for(sup.run(), 10)
    assert "gave up after" in str(info.value) and "unavailable (max_unavailable_s 120)" in str(info.value)
    assert isinstance(info.value.__cause__, Unavailable)
    assert 120 < clock.now() <= 131


async def test_an_outage_after_a_healthy_run_starts_its_backoff_afresh() -> None:
    clock = FakeClock()

    class Flapping(Unreachable):
        """Attempts 1-5 and 7-8 are refused; 6 runs for an hour, then loses its server; 9 stays up."""

        async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            self.attempts += 1
            if self.attempts == 6:
                task_status.started()
                clock.advance(3600)
                raise Unavailable("connection reset")
            if self.attempts <= 8:
                raise Unavailable("connection refused")
            task_status.started()
            self.up.set()
            await anyio.sleep_forever()

    child = Flapping(outages=0)
    sup = Supervisor("s", [ChildSpec(child)], backoff=Backoff(0.1, 100.0), clock=clock, rng=random.Random(3))
    task = asyncio.create_task(sup.run())
    await asyncio.wait_for(child.up.wait(), 10)
    # 5 growing delays, then the outage after the healthy run starts again at the base delay
    first, second = clock.sleeps[:5], clock.sleeps[5:]
    assert first[-1] > 0.5 and second[0] <= 0.1
    sup.request_stop()
    await task
