"""Running blocking calls off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.to_thread

T = TypeVar("T")


class BlockingRunner:
    """Runs blocking callables in worker threads, at most ``capacity`` at once.

    Each actor gets its own runner so that one blocking library (a binlog reader,
    a Spark job) cannot take every thread of the shared pool and starve the rest.
    """

    def __init__(self, capacity: int = 1) -> None:
        self.limiter = anyio.CapacityLimiter(capacity)

    async def run(self, fn: Callable[..., T], *args: object, abandon_on_cancel: bool = False) -> T:
        """Call ``fn(*args)`` in a worker thread and return its result.

        With ``abandon_on_cancel`` a cancelled caller stops waiting at once and the
        thread finishes on its own; use it only when the result can be thrown away.
        That thread is a daemon (a :class:`Begun`): the interpreter joins anyio's worker
        threads at exit, and a question to a server that answers nothing, abandoned by a
        stop, held the process after its shutdown for the rest of its timeout.
        """
        if abandon_on_cancel:
            async with self.limiter:
                return await Begun(fn, *args).result()
        return await in_thread(fn, *args, limiter=self.limiter)

    @property
    def busy(self) -> int:
        """Threads in use now."""
        return int(self.limiter.borrowed_tokens)


async def in_thread(fn: Callable[..., T], *args: object, limiter: anyio.CapacityLimiter | None = None) -> T:
    """``fn(*args)`` in one of anyio's worker threads (``anyio.to_thread.run_sync``), keeping
    nothing there once it returns: for every blocking call that is not an actor's own
    (:class:`BlockingRunner`), such as a file written or a checkpoint saved.

    The call goes in a box the worker thread empties, and its result comes back in one this
    side empties: an idle anyio worker keeps its last call's arguments, result and exception
    until it runs another, which may be long after (a Kafka sink's producer handed over to be
    discarded lived on in one, its threads and sockets running; a file sink's last batch, its
    bytes). What it raises lets go of its frames (:func:`let_go`).

        >>> import anyio
        >>> anyio.run(in_thread, sum, [1, 2, 3])
        6
    """
    call: list[Any] = [fn, args]
    try:
        done = await anyio.to_thread.run_sync(_taken, call, limiter=limiter)
    except BaseException as exc:
        let_go(exc)
        raise
    return cast(T, done.pop())


def _taken(call: list[Any]) -> list[Any]:
    """``call``'s function called with its arguments, taken out of it first (:func:`in_thread`)."""
    fn, args = call
    call.clear()
    return [fn(*args)]


def let_go(exc: BaseException) -> None:
    """Clear the locals of the frames of plain functions in ``exc``'s traceback (and in those
    of the exceptions it was raised from), so that what they held goes now, not whenever
    ``exc`` goes: for an exception caught where those frames held a client worth closing.

    ``serve`` runs the cyclic collector seldom (``deltaforge/gctune.py``), and an exception is
    easily in a cycle (a future that holds it, held by a frame of its traceback), or kept
    (anyio's idle worker thread keeps the last one it caught until it runs another call). A
    Kafka producer given up in an outage kept its librdkafka threads, pipes and sockets,
    reconnecting, meanwhile: one more after each outage (chaos ``outage_cycles``).
    :class:`BlockingRunner` and :class:`Begun` do it to what their calls raise.

    A plain function's frame in a traceback has finished, or still runs and refuses (the
    catching frame, a worker thread's loop: left as it is). A generator's or a coroutine's is
    left: one that caught an exception and went on may be suspended, and clearing it would
    close it. A traceback keeps its file names and line numbers, all a log shows.

        >>> def fails(held: object) -> None:
        ...     raise RuntimeError("no")
        >>> try:
        ...     fails(object())
        ... except RuntimeError as exc:
        ...     let_go(exc)
        ...     print(exc.__traceback__.tb_next.tb_frame.f_locals)
        {}
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:
                with contextlib.suppress(RuntimeError):  # still running
                    tb.tb_frame.clear()
            tb = tb.tb_next
        stack += [e.__cause__, e.__context__]


_SUSPENDABLE = (
    inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
)


class Begun(Generic[T]):
    """A blocking call started now, in a thread of its own, whose result is awaited later.

    For work a later message needs but an actor's start must not wait for: a Kafka sink's
    exactly-once producer initialises its transactions while the source reads the first batch.
    Whoever begins one (in a coroutine: the call's end is told to its event loop) awaits it
    before letting go of it (the call may hold a connection).

        >>> import anyio
        >>> async def main() -> int:
        ...     begun = Begun(sum, [1, 2, 3])  # running already
        ...     return await begun.result()
        >>> anyio.run(main)
        6
    """

    def __init__(self, fn: Callable[..., T], *args: object) -> None:
        # The end is told to the event loop, not waited for in a worker thread: that thread,
        # abandoned by a cancelled caller, waited on for the call's end, and the interpreter
        # joins worker threads at exit, so a process whose last Kafka sink was still opening
        # (a broker away) lingered after its shutdown for as long as the call's timeout.
        self._loop = asyncio.get_running_loop()
        self._finished = asyncio.Event()
        self._outcome: tuple[T] | BaseException | None = None
        name = f"begun-{getattr(fn, '__name__', 'call')}"
        threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True).start()

    def _run(self, fn: Callable[..., T], args: tuple[object, ...]) -> None:
        try:
            self._outcome = (fn(*args),)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the result
            self._outcome = exc
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
                self._loop.call_soon_threadsafe(self._finished.set)

    async def result(self) -> T:
        """What the call returned, or raises what it raised. A cancelled caller stops waiting
        at once (the call goes on to its end)."""
        await self._finished.wait()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            # Held by neither this Begun nor this frame once raised: its traceback holds _run's
            # frame and this one, and each held it, a cycle (see let_go).
            self._outcome = None
            let_go(outcome)
            try:
                raise outcome
            finally:
                del outcome
        assert outcome is not None
        return outcome[0]
