"""Helpers for the supervisors' tests: a child driven by commands, a tree of them."""

from __future__ import annotations

import asyncio

import anyio
from anyio.abc import TaskStatus

from actors import NodeSnapshot
from supervision import (
    Backoff,
    ChildSpec,
    FakeClock,
    Fatal,
    Intensity,
    Restart,
    Strategy,
    Supervisor,
)
from tests.helpers import wait_until

NO_BACKOFF = Backoff(base=0.0, max=0.0)


class Probe:
    """A child driven by commands: 'fail', 'exit', 'fatal'."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name = name
        self.log = log
        self.commands: asyncio.Queue[str] = asyncio.Queue()
        self.running = False

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.log.append(("start", self.name))
        self.running = True
        task_status.started()
        try:
            cmd = await self.commands.get()
            if cmd == "fail":
                raise RuntimeError(f"{self.name} failed")
            if cmd == "fatal":
                raise Fatal(f"{self.name}: position lost")
        finally:
            self.running = False
            self.log.append(("stop", self.name))

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="probe", state="running" if self.running else "idle")


def probe_tree(
    strategy: Strategy,
    restart: Restart = Restart.PERMANENT,
    names: tuple[str, ...] = ("a", "b", "c"),
    intensity: Intensity | None = None,
) -> tuple[Supervisor, dict[str, Probe], list[tuple[str, str]]]:
    log: list[tuple[str, str]] = []
    probes = {n: Probe(n, log) for n in names}
    sup = Supervisor(
        "sup",
        [ChildSpec(p, restart=restart) for p in probes.values()],
        strategy=strategy,
        intensity=intensity or Intensity(10, 60),
        backoff=NO_BACKOFF,
    )
    return sup, probes, log


async def wait_started(sup: Supervisor, log: list[tuple[str, str]], count: int) -> None:
    await wait_until(lambda: sum(1 for e in log if e[0] == "start") >= count, what=f"{count} starts")


class Flaky:
    """Fails at given fake-clock times, one failure per run."""

    def __init__(self, name: str, clock: FakeClock, times: list[float]) -> None:
        self.name = name
        self.clock = clock
        self.times = list(times)
        self.failures = 0
        self.exhausted = asyncio.Event()

    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if not self.times:
            task_status.started()
            self.exhausted.set()
            await anyio.sleep_forever()
        self.clock.set(self.times.pop(0))
        self.failures += 1
        raise RuntimeError(f"failure {self.failures}")

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot(name=self.name, kind="flaky", state="x")
