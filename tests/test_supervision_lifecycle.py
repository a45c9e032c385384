"""Supervisors starting and stopping their children: start order, group restarts, shutdown,
fresh state behind stable refs, and every restart logged."""

from __future__ import annotations

import asyncio
import traceback

import anyio
import pytest
from anyio.abc import TaskStatus
from structlog.testing import capture_logs

from actors import Actor, ActorCell, NodeSnapshot
from supervision import (
    ChildSpec,
    Strategy,
    Supervisor,
)
from tests.helpers import wait_until
from tests.supervision_kit import NO_BACKOFF, Probe, probe_tree, wait_started


async def test_shutdown_stops_children_in_reverse_order() -> None:
    sup, _probes, log = probe_tree(Strategy.ONE_FOR_ONE, names=("first", "second", "third"))
    task = asyncio.create_task(sup.run())
    await wait_started(sup, log, 3)
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
    sup, probes, log = probe_tree(Strategy.ONE_FOR_ONE, names=("a",))
    with capture_logs() as logs:
        task = asyncio.create_task(sup.run())
        await wait_started(sup, log, 1)
        probes["a"].commands.put_nowait("fail")
        await wait_started(sup, log, 2)
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


class CancelledInside:
    """Dies on its first run of a wait that something else cancelled (as a client library cancels
    its pending calls); stays up after."""

    name = "inside"

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.runs += 1
        task_status.started()
        wait = asyncio.get_running_loop().create_future()
        if self.runs == 1:
            asyncio.get_running_loop().call_soon(wait.cancel)
        await wait

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="task", state="running")


async def test_a_child_cancelled_from_outside_is_restarted_with_the_stack_of_the_cancelled_wait() -> None:
    """The restart's log names where the cancellation hit: without it a chaos run's crash said only
    "cancelled from outside its supervisor"."""
    child = CancelledInside()
    sup = Supervisor("s", [ChildSpec(child)], backoff=NO_BACKOFF)
    with capture_logs() as logs:
        task = asyncio.create_task(sup.run())
        await wait_until(lambda: child.runs == 2, what="restarted")
        sup.request_stop()
        await asyncio.wait_for(task, 3)
    [restart] = [e for e in logs if e["event"] == "child_restarted"]
    crash = restart["exc_info"]
    assert str(crash) == "cancelled from outside its supervisor"
    assert isinstance(crash.__cause__, asyncio.CancelledError)
    frames = [f.name for f in traceback.extract_tb(crash.__cause__.__traceback__)]
    assert frames[-1] == "run" and "_watch" in frames  # the child's await, under its supervisor


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
