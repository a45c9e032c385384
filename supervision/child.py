"""What a supervisor can supervise."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import anyio
from anyio.abc import TaskStatus

from actors.snapshot import NodeSnapshot


@runtime_checkable
class Child(Protocol):
    """Anything with a name, an async ``run()`` and a ``snapshot()``.

    ``run()`` calls ``task_status.started()`` once it is up (an actor: after its
    ``on_start``; a supervisor: after all its children are up) — OTP's start_link
    handshake: its supervisor starts the next child only then. Returning is a
    normal exit; raising is a failure. Each restart calls ``run()`` again on the
    same object, which must start from clean state. Actor cells and supervisors
    are both children, which is what makes trees.
    """

    name: str

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...

    def snapshot(self) -> NodeSnapshot: ...


class FunctionChild:
    """A child made of a plain coroutine function (handy for small tasks and tests)."""

    def __init__(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.fn = fn
        self.state = "new"

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.state = "running"
        task_status.started()
        try:
            await self.fn()
            self.state = "stopped"
        except BaseException:
            self.state = "crashed"
            raise

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="task", state=self.state)
