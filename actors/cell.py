"""ActorCell: runs one actor's lifecycle and is a supervision child."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskStatus

from actors.actor import Actor
from actors.errors import ActorStopped
from actors.mailboxes import Envelope, Mailbox
from actors.ref import ActorRef
from actors.snapshot import NodeSnapshot

A = TypeVar("A", bound=Actor)


class ActorCell(Generic[A]):
    """Owns an actor's mailbox and runs a fresh actor instance per ``run()``.

    ``run()`` returns when the actor calls ``stop()`` (a normal exit) and raises
    when a hook raises (a failure). A supervisor calls ``run()`` again to restart;
    the factory builds a new instance, so no state survives a crash. Messages
    still queued when the actor ends are dropped and their askers told
    :class:`ActorStopped` — senders of work must resend from durable state, which
    is exactly what a CDC pipeline does by resuming from checkpoints.

    ``run()`` reports "started" to its supervisor (``task_status.started()``) once
    ``on_start`` has returned, so the next child starts only after this one is up.
    """

    def __init__(self, name: str, factory: Callable[[], A], mailbox_size: int | None = None) -> None:
        self.name = name
        self.factory = factory
        self._capacity = mailbox_size
        self.mailbox: Mailbox | None = None
        self.ref: ActorRef[A] = ActorRef(self)
        self.actor: A | None = None
        self.state = "new"
        self.processed = 0
        # The first mailbox exists before the first start so that wiring code may
        # tell an actor before the supervisor has got round to starting it.
        self.mailbox = Mailbox(self._mailbox_capacity())

    def _mailbox_capacity(self) -> int:
        return self._capacity if self._capacity is not None else type(self._probe()).mailbox_size

    def _probe(self) -> A:
        if self.actor is None:
            self.actor = self.factory()
        return self.actor

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """One incarnation of the actor, from ``on_start`` to ``on_stop``."""
        if self.mailbox is None:
            self.mailbox = Mailbox(self._mailbox_capacity())
        # The probe instance made for the capacity is the first incarnation.
        actor = self.actor if self.actor is not None and self.state == "new" else self.factory()
        self.actor = actor
        actor._attach(self.ref, self.name)
        mailbox = self.mailbox
        self.state = "running"
        ended = False  # with an error of its own, which the supervisor judges it by
        try:
            await actor.on_start()
            task_status.started()
            while not actor._stop_requested:
                envelope = await mailbox.get()
                await self._handle(actor, envelope)
            self.state = "stopped"
        except BaseException:
            self.state = "crashed"
            ended = True
            raise
        finally:
            self.mailbox = None
            for left in mailbox.close():
                if left.reply is not None:
                    left.reply.close()
            with anyio.CancelScope(shield=True):
                try:
                    await actor.on_stop()
                except Exception as exc:
                    if not ended:
                        raise
                    # The clean-up failing on the way out (a connection that does not answer its
                    # goodbye) must not stand in for the error the actor ended with: a server
                    # unavailable would be judged a crash.
                    actor.log.warning("on_stop_failed", reason=f"{type(exc).__name__}: {exc}", exc_info=True)

    async def _handle(self, actor: A, envelope: Envelope) -> None:
        reply = envelope.reply
        try:
            result: Any = await actor.receive(envelope.message)
        except Exception as exc:
            if reply is not None:
                _reply(reply, (False, exc))
            raise
        except BaseException:
            # Cancelled mid-message (a library cancelled a future the handler awaited, or the task
            # was): the asker hears now that no reply is coming, not when its own timeout runs out.
            if reply is not None:
                reply.close()
            raise
        finally:
            self.processed += 1
        if reply is not None:
            _reply(reply, (True, result))

    def snapshot(self) -> NodeSnapshot:
        mb = self.mailbox
        return NodeSnapshot(
            name=self.name,
            kind="actor",
            state=self.state,
            mailbox_depth=mb.depth if mb is not None else 0,
            mailbox_capacity=mb.capacity if mb is not None else self._capacity,
        )


def _reply(stream: Any, value: tuple[bool, Any]) -> None:
    try:
        stream.send_nowait(value)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.WouldBlock):
        pass  # the asker gave up (timeout): nobody to tell
    finally:
        stream.close()


__all__ = ["ActorCell", "ActorStopped"]
