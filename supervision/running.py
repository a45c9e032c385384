"""A supervisor's bookkeeping for its children: each one's record, its exits, and why it ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from supervision.errors import Fatal, Unavailable
from supervision.spec import ChildSpec


@dataclass(eq=False)
class Running:
    """The supervisor's bookkeeping for one child."""

    spec: ChildSpec
    task: asyncio.Task[None] | None = None
    generation: int = 0
    stopping: bool = False
    state: str = "new"
    restarts: int = 0
    started_at: float = 0.0
    outage_since: float | None = None
    """When the child's current run of :class:`Unavailable` exits began."""
    outage_attempts: int = 0
    done: bool = False
    """Ended and, by its restart type, not to be started again."""
    last_error: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    restart_reasons: dict[str, int] = field(default_factory=dict)
    """Restarts by why (a short, stable label: see :func:`reason_kind`)."""


@dataclass(frozen=True, slots=True)
class Exited:
    """A child's task ended: which run of it (``generation``), and with what (``None``: normally)."""

    running: Running
    generation: int
    error: BaseException | None


def describe(exc: BaseException | None) -> str | None:
    """An exit's reason as the tree's snapshot and the logs show it."""
    if exc is None:
        return None
    if isinstance(exc, Fatal):
        return f"fatal: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def reason_kind(exc: BaseException | None) -> str:
    """Why a child restarted, as a metric label: few values, none with a message in it."""
    if exc is None:
        return "exit"
    if isinstance(exc, Unavailable):
        return "unavailable"
    return type(exc).__name__


class Started:
    """The ``task_status`` handed to a child: ``started()`` is its "I am up"."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def started(self, value: None = None) -> None:
        self.event.set()
