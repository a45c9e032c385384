"""A small actor runtime on anyio, independent of CDC.

An :class:`Actor` owns its state and handles one message at a time from a bounded
mailbox. Other code talks to it only through an :class:`ActorRef`:

* ``await ref.tell(msg)`` enqueues and returns; while the mailbox is full it waits.
  That wait *is* the backpressure of every pipeline built on this runtime.
* ``await ref.ask(msg, timeout=...)`` enqueues and waits for the value ``receive``
  returns (or the exception it raised).
* ``ref.busy`` / ``await ref.wait_idle()`` say whether the actor is handling a message
  (or has some queued) and wait until it waits for work again: a sender that would rather
  grow its next message than queue it behind the one being handled.

Actors are run by :class:`ActorCell`, which is also a supervision child: every start
builds a fresh actor instance from its factory, so a restart begins from clean state.
"""

from actors.actor import Actor
from actors.cell import ActorCell
from actors.errors import ActorError, ActorStopped, AskTimeout
from actors.message import Ask, message
from actors.ref import ActorRef
from actors.snapshot import NodeSnapshot
from actors.threads import Begun, BlockingRunner, in_thread, let_go

__all__ = [
    "Actor",
    "ActorCell",
    "ActorError",
    "ActorRef",
    "ActorStopped",
    "Ask",
    "AskTimeout",
    "Begun",
    "BlockingRunner",
    "NodeSnapshot",
    "in_thread",
    "let_go",
    "message",
]
