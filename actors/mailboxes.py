"""A bounded mailbox on an anyio memory object stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message in a mailbox, with the channel to answer on when it was asked."""

    message: Any
    reply: MemoryObjectSendStream[tuple[bool, Any]] | None = None


class Mailbox:
    """A bounded FIFO queue of envelopes.

    ``put`` waits while the queue is full; that wait is how a slow actor slows the
    actors that feed it. Closing the mailbox wakes every waiting sender with
    :class:`anyio.BrokenResourceError`, and every task waiting in :meth:`wait_idle`.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._send: MemoryObjectSendStream[Envelope]
        self._recv: MemoryObjectReceiveStream[Envelope]
        self._send, self._recv = anyio.create_memory_object_stream[Envelope](capacity)
        self._idle: anyio.Event | None = None
        self._getting = False  # the actor waits in get()

    async def put(self, envelope: Envelope) -> None:
        await self._send.send(envelope)

    def put_nowait(self, envelope: Envelope) -> None:
        """Enqueue or raise :class:`anyio.WouldBlock` when full."""
        self._send.send_nowait(envelope)

    async def get(self) -> Envelope:
        self._getting = True
        if self._idle is not None and self.depth == 0:
            self._idle.set()
            self._idle = None
        try:
            return await self._recv.receive()
        finally:
            self._getting = False

    def get_nowait(self) -> Envelope:
        return self._recv.receive_nowait()

    @property
    def depth(self) -> int:
        return self._send.statistics().current_buffer_used

    @property
    def busy(self) -> bool:
        """The actor is not waiting for a message (it handles one, or has not started), or some
        are queued."""
        return self.depth > 0 or not self._getting

    async def wait_idle(self) -> None:
        """Return once the actor waits for a message with none queued (at once if it does now),
        or the mailbox is closed."""
        if not self.busy:
            return
        if self._idle is None:
            self._idle = anyio.Event()
        await self._idle.wait()

    @property
    def waiting_senders(self) -> int:
        """Tasks blocked in ``put`` right now: the visible form of backpressure."""
        return self._send.statistics().tasks_waiting_send

    def close(self) -> list[Envelope]:
        """Close both ends; return what was still queued so askers can be told."""
        left: list[Envelope] = []
        while True:
            try:
                left.append(self._recv.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._recv.close()
        self._send.close()
        if self._idle is not None:
            self._idle.set()
            self._idle = None
        return left
