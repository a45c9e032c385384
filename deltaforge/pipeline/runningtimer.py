"""A timer that counts only the time this process ran: ``loop.call_later`` for "unanswered for
30 s" watches, which a pause of the whole process (a VM paused, a laptop's lid, SIGSTOP) must
not set off. As ``serve`` resumes from such a pause every plain timer is due at once, before
the answer its watch waits for (a delivery's, back from a worker thread) is taken: seed 3402's
serve_paused listed its Kafka sink ``delivery unanswered for 30 s`` for 4 ms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

STEP_S = 1.0
"""How often the timer looks at the clock."""
STALL_S = 5.0
"""A look this late finds the process paused: that step counts as its own length only."""


class Handle(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """What the timer uses of an event loop (a test's fake clock is one)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Handle: ...


class RunningTimer:
    """Calls ``fn(*args)`` once ``delay`` seconds of running have passed, unless cancelled.

    >>> import asyncio
    >>> async def main() -> bool:
    ...     due = asyncio.Event()
    ...     RunningTimer(asyncio.get_running_loop(), 0.01, due.set)
    ...     await due.wait()
    ...     return due.is_set()
    >>> asyncio.run(main())
    True
    """

    __slots__ = ("_args", "_armed_at", "_cancelled", "_fn", "_handle", "_left", "_loop", "_stall", "_step")

    def __init__(
        self,
        loop: Loop,
        delay: float,
        fn: Callable[..., Any],
        *args: Any,
        step: float = STEP_S,
        stall: float = STALL_S,
    ) -> None:
        self._loop, self._left, self._fn, self._args = loop, delay, fn, args
        self._step, self._stall = step, stall
        self._cancelled = False
        self._handle: Handle | None = None
        self._arm()

    def _arm(self) -> None:
        wait = min(self._step, self._left)
        self._armed_at = self._loop.time()
        self._handle = self._loop.call_later(wait, self._look, wait)

    def _look(self, wait: float) -> None:
        ran = self._loop.time() - self._armed_at
        self._left -= ran if ran - wait <= self._stall else wait
        if self._left > 0:
            self._arm()
            return
        self._handle = None  # nothing of this timer's stays in a cycle with it
        self._fn(*self._args)

    def cancel(self) -> None:
        self._cancelled = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def cancelled(self) -> bool:
        return self._cancelled
