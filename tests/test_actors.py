"""The actor runtime: tell/ask, bounded mailboxes, backpressure, blocking calls."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import anyio
import anyio.lowlevel
import psutil
import pytest
import structlog.testing

from actors import Actor, ActorCell, ActorStopped, AskTimeout, message
from tests.helpers import a_cancelled_wait_lets_the_process_exit, wait_until


@message
class Work:
    n: int


@message
class Echo:
    value: Any


@message
class Boom:
    pass


@message
class Abandoned:
    pass


class Gated(Actor):
    """Handles each message only after the gate opens."""

    mailbox_size = 4

    def __init__(self, gate: anyio.Event, seen: list[int]) -> None:
        super().__init__()
        self.gate = gate
        self.seen = seen

    async def receive(self, message: Any) -> Any:
        await self.gate.wait()
        if isinstance(message, Work):
            self.seen.append(message.n)
        return None


class EchoActor(Actor):
    async def receive(self, message: Any) -> Any:
        if isinstance(message, Echo):
            return message.value
        if isinstance(message, Boom):
            raise ValueError("boom")
        if isinstance(message, Work):
            await anyio.sleep(3600)
        if isinstance(message, Abandoned):
            lost = asyncio.get_running_loop().create_future()
            lost.cancel()  # what nats-py did to a publish's ack future the handler gathered
            await asyncio.gather(lost)
        return None


async def _run_cell(cell: ActorCell) -> asyncio.Task[None]:
    task = asyncio.create_task(cell.run())
    await wait_until(lambda: cell.state == "running", what="actor running")
    return task


def test_messages_are_frozen_and_slotted() -> None:
    w = Work(1)
    with pytest.raises(AttributeError):
        w.n = 2  # type: ignore[misc]
    assert not hasattr(w, "__dict__")


async def test_tell_blocks_while_mailbox_full_and_resumes_when_drained() -> None:
    gate = anyio.Event()
    seen: list[int] = []
    cell = ActorCell("gated", lambda: Gated(gate, seen))
    task = await _run_cell(cell)
    # One message is taken by the actor (blocked on the gate); four fill the mailbox.
    for i in range(5):
        await cell.ref.tell(Work(i))
    await wait_until(lambda: cell.ref.mailbox_depth == 4, what="mailbox full")

    producer_done = anyio.Event()

    async def producer() -> None:
        await cell.ref.tell(Work(5))
        producer_done.set()

    p = asyncio.create_task(producer())
    # Observe the producer parked in the mailbox, not merely slow.
    await wait_until(lambda: cell.ref.waiting_senders == 1, what="producer blocked")
    assert not producer_done.is_set()
    gate.set()
    await wait_until(producer_done.is_set, what="producer released")
    await wait_until(lambda: len(seen) == 6, what="all handled")
    assert seen == [0, 1, 2, 3, 4, 5]
    task.cancel()
    await asyncio.gather(task, p, return_exceptions=True)


@pytest.mark.anyio
async def test_wait_idle_returns_once_the_actor_waits_for_work_or_stops() -> None:
    gate = anyio.Event()
    seen: list[int] = []
    cell = ActorCell("gated", lambda: Gated(gate, seen))
    woke: list[tuple[str, int, bool]] = []

    async def waiter(name: str, of: ActorCell[Gated] = cell) -> None:
        await of.ref.wait_idle()
        woke.append((name, len(seen), of.ref.busy))

    async with anyio.create_task_group() as tg:
        await tg.start(cell.run)
        await anyio.wait_all_tasks_blocked()
        assert not cell.ref.busy
        await cell.ref.wait_idle()  # waiting for work now: at once
        for i in range(3):
            await cell.ref.tell(Work(i))  # one handled (held at the gate), two queued
        assert cell.ref.busy
        tg.start_soon(waiter, "first")
        tg.start_soon(waiter, "second")
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        gate.set()
        await anyio.wait_all_tasks_blocked()
        # Not when the last was taken: once all three were handled and it waits again
        assert woke == [("first", 3, False), ("second", 3, False)]
        tg.cancel_scope.cancel()

    # An actor that stops busy: its mailbox is closed, and the waiter woken
    stopping = ActorCell("gated", lambda: Gated(anyio.Event(), []))
    async with anyio.create_task_group() as tg:
        running = anyio.CancelScope()

        async def run() -> None:
            with running:
                await stopping.run()

        tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        await stopping.ref.tell(Work(0))
        tg.start_soon(waiter, "stopped", stopping)
        await anyio.wait_all_tasks_blocked()
        assert len(woke) == 2
        running.cancel()
        await anyio.wait_all_tasks_blocked()
    assert woke[2] == ("stopped", 3, False)


class SlowCounter(Actor):
    mailbox_size = 64

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.max_depth = 0

    async def receive(self, message: Any) -> Any:
        self.count += 1
        if self.count % 64 == 0:
            self.max_depth = max(self.max_depth, self.ref.mailbox_depth)
            await anyio.lowlevel.checkpoint()  # slower than the producer: yields every chunk
        return None


@pytest.mark.slow
async def test_memory_stays_bounded_for_slow_consumer_of_a_million_messages() -> None:
    proc = psutil.Process()
    actor = SlowCounter()
    cell = ActorCell("slow", lambda: actor)
    task = await _run_cell(cell)
    rss_before = proc.memory_info().rss
    peak = rss_before
    n = 1_000_000
    for i in range(n):
        await cell.ref.tell(Work(i))
        if i % 50_000 == 0:
            peak = max(peak, proc.memory_info().rss)
    await wait_until(lambda: actor.count == n, timeout=120, what="all consumed")
    assert actor.max_depth <= 64
    # A million queued Work objects would need well over 50 MB; bounded means flat.
    assert peak - rss_before < 20 * 1024 * 1024, f"RSS grew by {(peak - rss_before) / 1e6:.1f} MB"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_ask_returns_the_reply() -> None:
    cell = ActorCell("echo", EchoActor)
    task = await _run_cell(cell)
    assert await cell.ref.ask(Echo({"a": 1})) == {"a": 1}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_ask_past_timeout_raises_clear_error() -> None:
    cell = ActorCell("echo", EchoActor)
    task = await _run_cell(cell)
    with pytest.raises(AskTimeout, match=r"'echo' did not reply to Work within 0.05s"):
        await cell.ref.ask(Work(1), timeout=0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_ask_to_stopped_actor_raises_actor_stopped() -> None:
    cell = ActorCell("echo", EchoActor)
    task = await _run_cell(cell)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(ActorStopped, match="'echo' is not running"):
        await cell.ref.ask(Echo(1))
    with pytest.raises(ActorStopped):
        await cell.ref.tell(Echo(1))


async def test_ask_when_actor_dies_before_replying() -> None:
    cell = ActorCell("echo", EchoActor)
    task = await _run_cell(cell)
    await cell.ref.tell(Work(1))  # parks the actor
    waiter = asyncio.create_task(cell.ref.ask(Echo(2)))
    await wait_until(lambda: cell.ref.mailbox_depth == 1, what="ask queued")
    task.cancel()
    with pytest.raises(ActorStopped, match="stopped before replying"):
        await waiter
    await asyncio.gather(task, return_exceptions=True)


async def test_an_asker_hears_at_once_when_the_message_it_waits_on_is_cancelled() -> None:
    """A handler that dies of a CancelledError (a future it awaited was cancelled under it) does
    not reply: the asker is told so at once. It waited for its own timeout before, 120 s for a
    sink's batch, and the whole pipeline with it, while /health said ok (chaos nats_leader_loss)."""
    cell = ActorCell("echo", EchoActor)
    task = await _run_cell(cell)
    with anyio.fail_after(30), pytest.raises(ActorStopped, match="stopped before replying"):
        await cell.ref.ask(Abandoned(), timeout=None)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cell.state == "crashed"


async def test_ask_raises_what_receive_raised_and_actor_crashes() -> None:
    cell = ActorCell("echo", EchoActor)
    task = await _run_cell(cell)
    with pytest.raises(ValueError, match="boom"):
        await cell.ref.ask(Boom())
    with pytest.raises(ValueError):
        await task
    assert cell.state == "crashed"


class Lifecycle(Actor):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    async def on_start(self) -> None:
        self.events.append("start")

    async def receive(self, message: Any) -> Any:
        self.events.append(f"msg:{message.value}")
        if message.value == "bye":
            self.stop()

    async def on_stop(self) -> None:
        self.events.append("stop")


async def test_lifecycle_hooks_and_normal_stop() -> None:
    events: list[str] = []
    cell = ActorCell("life", lambda: Lifecycle(events))
    task = asyncio.create_task(cell.run())
    await cell.ref.tell(Echo("hi"))
    await cell.ref.tell(Echo("bye"))
    await task  # returns normally
    assert events == ["start", "msg:hi", "msg:bye", "stop"]
    assert cell.state == "stopped"


class StopFails(Actor):
    """Fails on ``Boom`` with the error it was given; its ``on_stop`` fails too, another way."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Boom):
            raise self.error
        self.stop()

    async def on_stop(self) -> None:
        raise TimeoutError("the goodbye was not answered")


async def test_a_failing_on_stop_never_hides_what_the_actor_ended_with() -> None:
    """A supervisor judges an actor by the error it ended with (a server unavailable is waited
    for; a crash is counted): the clean-up's own failure, on the way out (a connection that does
    not answer its goodbye), replaced it, and a wait became a crash. A normal exit whose clean-up
    fails is still a failure."""
    ended = LookupError("the actor's own error")
    cell = ActorCell("stopfails", lambda: StopFails(ended))
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(cell.run())
        await cell.ref.tell(Boom())
        with pytest.raises(LookupError) as raised:
            await task
    assert raised.value is ended
    said = [r for r in logs if r["event"] == "on_stop_failed"]
    assert said and "the goodbye was not answered" in said[0]["reason"], logs
    cell = ActorCell("stopfails", lambda: StopFails(ended))
    task = asyncio.create_task(cell.run())
    await cell.ref.tell(Echo("bye"))
    with pytest.raises(TimeoutError):
        await task


class Blocker(Actor):
    blocking_threads = 2

    async def receive(self, message: Any) -> Any:
        return await self.run_blocking(_blocking_call, message.value)


_in_threads: set[int] = set()
_lock = threading.Lock()
_max_concurrent = 0
_current = 0


def _blocking_call(barrier_wait: float) -> int:
    global _current, _max_concurrent
    with _lock:
        _current += 1
        _max_concurrent = max(_max_concurrent, _current)
    _in_threads.add(threading.get_ident())
    threading.Event().wait(barrier_wait)
    with _lock:
        _current -= 1
    return threading.get_ident()


async def test_blocking_calls_run_off_the_loop_with_a_capacity_limit() -> None:
    from actors import BlockingRunner

    runner = BlockingRunner(2)
    loop_thread = threading.get_ident()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.005)

    t = asyncio.create_task(ticker())
    results = await asyncio.gather(*(runner.run(_blocking_call, 0.1) for _ in range(6)))
    t.cancel()
    assert loop_thread not in results
    assert _max_concurrent == 2
    assert ticks > 10  # the loop kept running while threads blocked

    cell = ActorCell("blocker", Blocker)
    task = await _run_cell(cell)
    assert await cell.ref.ask(Echo(0.0)) != loop_thread
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_process_exits_without_waiting_for_a_begun_call_nobody_awaits_any_more() -> None:
    """A cancelled waiter of a begun call left a worker thread waiting for the call's end, and
    the interpreter joins worker threads at exit: ``serve`` stopped with a Kafka sink still
    opening (its broker away) logged ``shutdown_complete`` and lingered for the rest of the
    call's timeout (27 s seen). The call's own thread is a daemon: nothing waits for it now."""
    a_cancelled_wait_lets_the_process_exit(
        "import time\nfrom actors import Begun", "Begun(time.sleep, 600).result"
    )


def test_a_process_exits_without_waiting_for_a_call_its_cancelled_caller_abandoned() -> None:
    """``BlockingRunner.run(..., abandon_on_cancel=True)`` ran in an anyio worker thread, which
    the interpreter joins at exit: a MySQL source's question to a server answering nothing,
    abandoned by a stop, held ``serve`` after ``shutdown_complete`` for the rest of its timeout."""
    a_cancelled_wait_lets_the_process_exit(
        "import functools, time\nfrom actors import BlockingRunner",
        "functools.partial(BlockingRunner().run, time.sleep, 600, abandon_on_cancel=True)",
    )


async def test_a_begun_call_runs_before_it_is_awaited_and_hands_over_its_result_or_error() -> None:
    from actors import Begun

    started, release = threading.Event(), threading.Event()

    def work(x: int) -> int:
        started.set()
        release.wait(30)
        return 2 * x

    begun = Begun(work, 21)
    assert await anyio.to_thread.run_sync(started.wait, 30)  # running before anyone awaits it
    async with anyio.create_task_group() as tg:
        tg.start_soon(begun.result)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()  # a cancelled waiter stops waiting while the call goes on
    assert not release.is_set()
    release.set()
    assert await begun.result() == 42

    def fail() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await Begun(fail).result()
