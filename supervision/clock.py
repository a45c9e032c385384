"""Clocks: the real one and a fake one for tests that must not sleep."""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    """Time as a supervisor sees it."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """Real time."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class FakeClock:
    """Time that moves only when told: ``sleep`` advances it instantly.

    Recorded sleeps let tests check backoff delays without waiting for them.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = max(self._now, when)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._now += seconds
        await anyio.lowlevel.checkpoint()
