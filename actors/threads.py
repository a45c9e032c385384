"""Running blocking calls off the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

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
        """
        return await anyio.to_thread.run_sync(
            fn, *args, limiter=self.limiter, abandon_on_cancel=abandon_on_cancel
        )

    @property
    def busy(self) -> int:
        """Threads in use now."""
        return int(self.limiter.borrowed_tokens)
