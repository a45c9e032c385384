"""Supervisors waiting: restart backoff, and outages (Unavailable) waited for, never counted as
crashes."""

from __future__ import annotations

import asyncio
import random

import anyio
import pytest
from anyio.abc import TaskStatus
from structlog.testing import capture_logs

from actors import NodeSnapshot
from supervision import (
    Backoff,
    ChildSpec,
    FakeClock,
    Intensity,
    Supervisor,
    SupervisorFailed,
    Unavailable,
)
from tests.helpers import wait_until
from tests.supervision_kit import Flaky, Probe


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


class _HeldClock(FakeClock):
    """A clock whose sleeps end only when told (never, here): a restart's backoff as long as any."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeping = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.sleeping.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize("outage", [True, False])
async def test_a_stop_during_a_restarts_backoff_ends_it_at_once(outage: bool) -> None:
    """A stop asked while the supervisor waited out a child's backoff (an outage's or a crash's)
    was seen only once the backoff ended: up to its maximum (10 s by default) added to a SIGTERM
    during a long outage."""
    clock = _HeldClock()
    child = Unreachable(outages=5) if outage else Flaky("flaky", clock, [1.0, 2.0])
    sup = Supervisor("s", [ChildSpec(child)], backoff=Backoff(60, 60), clock=clock, rng=random.Random(4))
    task = asyncio.create_task(sup.run())
    await asyncio.wait_for(clock.sleeping.wait(), 10)
    sup.request_stop()
    await asyncio.wait_for(task, 10)
    assert len(clock.sleeps) == 1 and sup.state == "stopped"
