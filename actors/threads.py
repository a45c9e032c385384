"""Running blocking calls off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

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
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    @property
    def busy(self) -> int:
        """Threads in use now."""
        return int(self.limiter.borrowed_tokens)


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
            raise outcome
        assert outcome is not None
        return outcome[0]
