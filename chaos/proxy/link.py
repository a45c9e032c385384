"""One proxied connection: two links (client → upstream, upstream → client) through toxics.

Each link reads into a bounded queue (backpressure: a slow toxic stops the reads)
and a writer passes every chunk through the toxics of its direction, in the
order they were added, looked up afresh for each chunk — so a toxic added or
removed through the API acts on connections that are already open, as in
Toxiproxy. Time-driven toxics (``timeout``) get a timer per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
from collections.abc import Callable

from chaos.proxy.toxics import CloseLink, LinkState, Toxic

CHUNK = 32 * 1024
QUEUE = 32  # chunks read ahead per link


class Connection:
    """A client connection and its upstream connection, joined through toxics."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        toxics: Callable[[str], list[Toxic]],
        on_close: Callable[[Connection], None],
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.toxics = toxics
        self.on_close = on_close
        self.rolled: dict[tuple[str, int], bool] = {}  # (toxic name, id): applies to this connection?
        self.states: dict[tuple[str, str], LinkState] = {}
        self.timers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._link("upstream", self.client[0], self.upstream[1])),
            asyncio.create_task(self._link("downstream", self.upstream[0], self.client[1])),
        ]
        self.toxics_changed()

    def applies(self, toxic: Toxic) -> bool:
        key = (toxic.name, id(toxic))
        hit = self.rolled.get(key)
        if hit is None:
            hit = self.rolled[key] = random.random() < toxic.toxicity
        return hit

    def active(self, stream: str) -> list[Toxic]:
        return [t for t in self.toxics(stream) if self.applies(t)]

    def toxics_changed(self) -> None:
        """Start timers for time-driven toxics that now apply; cancel those of removed ones."""
        live: set[tuple[str, int]] = set()
        for stream in ("upstream", "downstream"):
            for toxic in self.active(stream):
                hold = toxic.hold_timeout_s()
                if hold is None:
                    continue
                key = (toxic.name, id(toxic))
                live.add(key)
                if key not in self.timers:
                    self.timers[key] = asyncio.create_task(self._close_after(hold))
        for key in [k for k in self.timers if k not in live]:
            self.timers.pop(key).cancel()

    async def _close_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.close()

    async def _link(self, stream: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[bytes, float] | None] = asyncio.Queue(QUEUE)

        async def read() -> None:
            try:
                while data := await reader.read(CHUNK):
                    await queue.put((data, time.monotonic()))
            except (ConnectionError, OSError):
                pass
            await queue.put(None)

        feeder = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                await self._through(stream, self.active(stream), item[0], item[1], writer)
            for toxic in self.active(stream):
                await toxic.end(self._state(stream, toxic))
        except CloseLink as exc:
            self.close(reset=exc.reset)
        except (ConnectionError, OSError):
            pass
        finally:
            feeder.cancel()
        self.close()

    async def _through(
        self, stream: str, toxics: list[Toxic], data: bytes, at: float, writer: asyncio.StreamWriter
    ) -> None:
        if not toxics:
            writer.write(data)
            await writer.drain()
            return
        first, rest = toxics[0], toxics[1:]

        async def emit(out: bytes, when: float) -> None:
            await self._through(stream, rest, out, when, writer)

        await first.pipe(self._state(stream, first), data, at, emit)

    def _state(self, stream: str, toxic: Toxic) -> LinkState:
        return self.states.setdefault((stream, toxic.name), LinkState())

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for _, writer in (self.client, self.upstream):
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()
        for task in [*self.tasks, *self.timers.values()]:
            if task is not asyncio.current_task():
                task.cancel()
        self.on_close(self)
