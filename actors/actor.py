"""The Actor base class: lifecycle hooks and a message handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import structlog

from actors.threads import BlockingRunner

if TYPE_CHECKING:
    from actors.ref import ActorRef

T = TypeVar("T")


class Actor:
    """Subclass this and override the hooks you need.

    Lifecycle, in order, for every (re)start:

    1. ``on_start()`` — open connections, load state. Raising here is a failure
       like any other and the supervisor decides whether to restart.
    2. ``receive(message)`` once per message, strictly one at a time. The return
       value is the reply to an ``ask``; for a ``tell`` it is dropped. An exception
       crashes the actor (the asker, if any, gets the exception too): let it crash
       and let the supervisor restart it from clean state.
    3. ``on_stop()`` — always called, after a crash, a ``stop()`` or a cancel.

    Class attributes tune the runtime: ``mailbox_size`` bounds the mailbox
    (the backpressure point) and ``blocking_threads`` bounds :meth:`run_blocking`.

        >>> import asyncio
        >>> from actors import Actor, ActorCell
        >>> class Doubler(Actor):
        ...     async def receive(self, message: int) -> int:
        ...         return message * 2
        >>> async def main() -> int:
        ...     cell = ActorCell("doubler", Doubler)
        ...     task = asyncio.create_task(cell.run())
        ...     answer = await cell.ref.ask(21)
        ...     task.cancel()
        ...     return answer
        >>> asyncio.run(main())
        42
    """

    mailbox_size: ClassVar[int] = 16
    blocking_threads: ClassVar[int] = 1

    def __init__(self) -> None:
        self._ref: ActorRef[Actor] | None = None
        self._stop_requested = False
        self._runner: BlockingRunner | None = None
        self.log: structlog.stdlib.BoundLogger = structlog.get_logger()

    # -- hooks -----------------------------------------------------------------
    async def on_start(self) -> None:
        """Called before the first message."""

    async def receive(self, message: Any) -> Any:
        """Handle one message. Override; the default rejects everything."""
        raise TypeError(f"{type(self).__name__} does not handle {type(message).__name__}")

    async def on_stop(self) -> None:
        """Called once when the actor ends, however it ends."""

    # -- helpers for subclasses --------------------------------------------------
    @property
    def ref(self) -> ActorRef[Actor]:
        """This actor's own reference (to hand to others)."""
        if self._ref is None:
            raise RuntimeError("actor is not attached to a cell yet")
        return self._ref

    def stop(self) -> None:
        """Finish after the current message: a normal exit, not a failure."""
        self._stop_requested = True

    async def run_blocking(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking call in this actor's own bounded thread pool."""
        if self._runner is None:
            self._runner = BlockingRunner(self.blocking_threads)
        return await self._runner.run(fn, *args)

    def _attach(self, ref: ActorRef[Actor], name: str) -> None:
        self._ref = ref
        self.log = structlog.get_logger().bind(actor=name)
