"""ActorRef: the only handle other code holds on an actor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import anyio

from actors.errors import ActorStopped, AskTimeout
from actors.mailboxes import Envelope
from actors.message import Ask

if TYPE_CHECKING:
    from actors.actor import Actor
    from actors.cell import ActorCell

A = TypeVar("A", bound="Actor", covariant=True)
R = TypeVar("R")


class ActorRef(Generic[A]):
    """A stable address for an actor of type ``A`` across its restarts.

    A restart gives the actor a fresh mailbox; the ref always points at the current
    one, so holders never need a new ref. While the actor is down, ``tell`` and
    ``ask`` raise :class:`ActorStopped` instead of queueing into the void. Asking
    an :class:`~actors.Ask` message is typed by its reply.
    """

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell[A]) -> None:
        self._cell = cell

    @property
    def name(self) -> str:
        return self._cell.name

    @property
    def mailbox_depth(self) -> int:
        mb = self._cell.mailbox
        return mb.depth if mb is not None else 0

    @property
    def waiting_senders(self) -> int:
        """How many tellers are blocked on this actor's full mailbox right now."""
        mb = self._cell.mailbox
        return mb.waiting_senders if mb is not None else 0

    @property
    def busy(self) -> bool:
        """Whether the actor is handling a message, or has some queued (False when it is not
        running: nothing will come of waiting for it)."""
        mb = self._cell.mailbox
        return mb is not None and mb.busy

    async def wait_idle(self) -> None:
        """Return once the actor waits for a message with none queued: at once if it does now or
        is not running, else when it has handled what it holds (or stops).

        For a sender that would rather grow its next message than queue it while the actor is
        busy (the accumulator: a batch grows while the sinks deliver the one before it)."""
        mb = self._cell.mailbox
        if mb is not None:
            await mb.wait_idle()

    async def tell(self, message: Any) -> None:
        """Enqueue ``message``; wait while the mailbox is full (backpressure)."""
        await self._put(Envelope(message))

    def try_tell(self, message: Any) -> bool:
        """Enqueue without waiting; False when the mailbox is full (nothing sent).

        For messages that are worthless when late, such as timer ticks.
        """
        mailbox = self._cell.mailbox
        if mailbox is None:
            raise ActorStopped(self.name)
        try:
            mailbox.put_nowait(Envelope(message))
        except anyio.WouldBlock:
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStopped(self.name) from None
        return True

    @overload
    async def ask(self, message: Ask[R], timeout: float | None = 30.0) -> R: ...

    @overload
    async def ask(self, message: object, timeout: float | None = 30.0) -> Any: ...

    async def ask(self, message: object, timeout: float | None = 30.0) -> Any:
        """Enqueue ``message`` and return what ``receive`` returns for it.

        Raises what ``receive`` raised, :class:`AskTimeout` past ``timeout``
        seconds (waiting for mailbox space counts), or :class:`ActorStopped` if the
        actor is down or dies before replying.
        """
        send, recv = anyio.create_memory_object_stream[tuple[bool, Any]](1)
        try:
            with anyio.fail_after(timeout):
                await self._put(Envelope(message, send))
                try:
                    ok, value = await recv.receive()
                except anyio.EndOfStream:
                    raise ActorStopped(self.name, "stopped before replying") from None
        except TimeoutError:
            raise AskTimeout(self.name, message, timeout or 0.0) from None
        finally:
            recv.close()
        if ok:
            return value
        raise value

    async def _put(self, envelope: Envelope) -> None:
        mailbox = self._cell.mailbox
        if mailbox is None:
            raise ActorStopped(self.name)
        try:
            await mailbox.put(envelope)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStopped(self.name) from None

    def __repr__(self) -> str:
        return f"ActorRef({self.name!r})"
