"""What a supervisor can supervise."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from actors.snapshot import NodeSnapshot


@runtime_checkable
class Child(Protocol):
    """Anything with a name, an async ``run()`` and a ``snapshot()``.

    ``run()`` returning is a normal exit; raising is a failure. Each restart calls
    ``run()`` again on the same object, which must start from clean state.
    Actor cells and supervisors are both children, which is what makes trees.
    """

    name: str

    async def run(self) -> None: ...

    def snapshot(self) -> NodeSnapshot: ...


class FunctionChild:
    """A child made of a plain coroutine function (handy for small tasks and tests)."""

    def __init__(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.fn = fn
        self.state = "new"

    async def run(self) -> None:
        self.state = "running"
        try:
            await self.fn()
            self.state = "stopped"
        except BaseException:
            self.state = "crashed"
            raise

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="task", state=self.state)
