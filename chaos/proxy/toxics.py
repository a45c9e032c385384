"""Toxics: what each one does to the bytes of one direction of one connection.

Semantics follow Toxiproxy's ``toxics/*.go`` (v2.9), its reference implementation:

* ``latency`` {latency, jitter} ms — each chunk leaves ``latency ± jitter`` after it
  arrived (pipelined: chunks queued behind one another do not add up).
* ``bandwidth`` {rate} KB/s — chunks are paced to ``rate`` * 1000 bytes a second; a
  chunk larger than 100 ms' worth goes out in 100 ms slices.
* ``slow_close`` {delay} ms — the close is passed on ``delay`` after the end of input.
* ``timeout`` {timeout} ms — no data passes (it is dropped); after ``timeout`` the
  connection is closed, or with 0 it stays open, dropping data, until the toxic goes.
* ``reset_peer`` {timeout} ms — on the first data, wait ``timeout`` then reset the
  connection (TCP RST: ``SO_LINGER`` 0); the data is dropped.
* ``slicer`` {average_size, size_variation, delay µs} — each chunk is split into
  slices of about ``average_size`` bytes, ``delay`` apart; every byte, in order.
* ``limit_data`` {bytes} — the connection is closed once ``bytes`` have passed.

``toxicity`` (0..1) is the chance that a toxic applies to a given connection,
rolled once per connection and toxic, as Toxiproxy does.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

Emit = Callable[[bytes, float], Awaitable[None]]


class CloseLink(Exception):
    """A toxic ends the connection (``reset``: abortively, with an RST)."""

    def __init__(self, reset: bool = False) -> None:
        super().__init__("reset" if reset else "close")
        self.reset = reset


class BadToxic(ValueError):
    """A toxic body that does not describe a valid toxic (HTTP 400)."""


@dataclass
class LinkState:
    """What a toxic remembers about one link (bytes passed, pacing debt, ...)."""

    values: dict[str, float] = field(default_factory=dict)


class Toxic:
    """A toxic as configured through the API; :meth:`pipe` applies it to one chunk."""

    type: ClassVar[str] = ""
    defaults: ClassVar[dict[str, int]] = {}

    def __init__(self, name: str, stream: str, toxicity: float, attributes: dict[str, Any]) -> None:
        self.name = name
        self.stream = stream
        self.toxicity = toxicity
        self.attributes = dict(self.defaults)
        self.update(attributes)

    def update(self, attributes: dict[str, Any]) -> None:
        for key, value in attributes.items():
            if key not in self.defaults:
                continue  # Toxiproxy ignores unknown attributes
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadToxic(f"bad request body: attribute {key!r} must be a number")
            self.attributes[key] = int(value)

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
        }

    def __getitem__(self, key: str) -> int:
        return self.attributes[key]

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        """Pass ``data`` (arrived at ``at``, monotonic seconds) on through ``emit``, or not."""
        await emit(data, at)

    async def end(self, state: LinkState) -> None:
        """The input ended: wait before the close is passed on (slow_close)."""

    def hold_timeout_s(self) -> float | None:
        """For time-driven toxics: close the connection this long after the toxic applies."""
        return None


class Latency(Toxic):
    type = "latency"
    defaults: ClassVar[dict[str, int]] = {"latency": 0, "jitter": 0}

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        delay = self["latency"]
        if self["jitter"] > 0:
            delay += random.randrange(-self["jitter"], self["jitter"])
        due = at + delay / 1000
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await emit(data, max(at, due))


class Bandwidth(Toxic):
    type = "bandwidth"
    defaults: ClassVar[dict[str, int]] = {"rate": 0}

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        rate = self["rate"] * 1000  # bytes a second
        if rate <= 0:
            await emit(data, at)
            return
        debt = state.values.get("debt", 0.0) + len(data) / rate
        step = rate // 10  # 100 ms worth
        while len(data) > step:
            await asyncio.sleep(0.1)
            await emit(data[:step], at)
            data = data[step:]
            debt -= 0.1
        start = time.monotonic()
        if debt > 0:
            await asyncio.sleep(debt)
        debt -= time.monotonic() - start
        state.values["debt"] = debt
        await emit(data, at)


class SlowClose(Toxic):
    type = "slow_close"
    defaults: ClassVar[dict[str, int]] = {"delay": 0}

    async def end(self, state: LinkState) -> None:
        await asyncio.sleep(self["delay"] / 1000)


class Timeout(Toxic):
    type = "timeout"
    defaults: ClassVar[dict[str, int]] = {"timeout": 0}

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        return  # dropped on the floor, as Toxiproxy does

    def hold_timeout_s(self) -> float | None:
        return self["timeout"] / 1000 if self["timeout"] > 0 else None


class ResetPeer(Toxic):
    type = "reset_peer"
    defaults: ClassVar[dict[str, int]] = {"timeout": 0}

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        await asyncio.sleep(self["timeout"] / 1000)
        raise CloseLink(reset=True)


class Slicer(Toxic):
    type = "slicer"
    defaults: ClassVar[dict[str, int]] = {"average_size": 0, "size_variation": 0, "delay": 0}

    def _cuts(self, start: int, end: int) -> list[int]:
        """Toxiproxy's recursive halving: slice edges, as [start, end, start, end, ...]."""
        if (end - start) - self["average_size"] <= self["size_variation"]:
            return [start, end]
        mid = start + (end - start) // 2
        if self["size_variation"] > 0:
            mid += random.randrange(-self["size_variation"], self["size_variation"])
        return self._cuts(start, mid) + self._cuts(mid, end)

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        if self["average_size"] <= 0:
            await emit(data, at)
            return
        cuts = self._cuts(0, len(data))
        for i in range(1, len(cuts), 2):
            await emit(data[cuts[i - 1] : cuts[i]], at)
            if self["delay"] > 0:
                await asyncio.sleep(self["delay"] / 1_000_000)


class LimitData(Toxic):
    type = "limit_data"
    defaults: ClassVar[dict[str, int]] = {"bytes": 0}

    async def pipe(self, state: LinkState, data: bytes, at: float, emit: Emit) -> None:
        passed = int(state.values.get("passed", 0))
        remaining = max(0, self["bytes"] - passed)
        data = data[:remaining]
        if data:
            await emit(data, at)
            passed += len(data)
            state.values["passed"] = passed
        if self["bytes"] - passed <= 0:
            raise CloseLink()


TYPES: dict[str, type[Toxic]] = {
    t.type: t for t in (Latency, Bandwidth, SlowClose, Timeout, ResetPeer, Slicer, LimitData)
}
STREAMS = ("upstream", "downstream")


def make_toxic(body: Any) -> Toxic:
    """A toxic from its JSON body, with Toxiproxy's defaults (stream downstream, toxicity 1,
    name ``<type>_<stream>``); raises :class:`BadToxic` with Toxiproxy's wording."""
    if not isinstance(body, dict):
        raise BadToxic("bad request body")
    stream = body.get("stream") or "downstream"
    if stream not in STREAMS:
        raise BadToxic("stream was invalid, can be either upstream or downstream")
    kind = body.get("type")
    if kind not in TYPES:
        raise BadToxic("invalid toxic type")
    toxicity = body.get("toxicity", 1.0)
    if isinstance(toxicity, bool) or not isinstance(toxicity, int | float):
        raise BadToxic("bad request body: toxicity must be a number")
    attributes = body.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise BadToxic("bad request body: attributes must be an object")
    name = body.get("name") or f"{kind}_{stream}"
    return TYPES[kind](str(name), stream, float(toxicity), attributes)
