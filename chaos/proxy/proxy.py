"""A named TCP proxy: listens, connects each client to its upstream, applies its toxics."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from chaos.proxy.link import Connection
from chaos.proxy.toxics import BadToxic, Toxic, make_toxic


class ProxyError(Exception):
    """An API-level failure with Toxiproxy's message and status code."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ProxyError(f"bad request body: address {address!r} is not host:port", 400)
    return host or "127.0.0.1", int(port)


class Proxy:
    """Toxiproxy's proxy: ``enabled: false`` stops listening and drops every connection;
    a new ``listen`` or ``upstream`` restarts it (dropping connections)."""

    def __init__(self, name: str, listen: str, upstream: str) -> None:
        self.name = name
        self.listen = listen or "127.0.0.1:0"
        self.upstream = upstream
        self.enabled = False
        self.toxics: list[Toxic] = []
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in self.toxics],
        }

    async def start(self) -> None:
        if self._server is not None:
            return
        host, port = split_address(self.listen)
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as exc:
            raise ProxyError(f"listen {self.listen}: {exc.strerror}", 500) from None
        bound = self._server.sockets[0].getsockname()
        self.listen = f"{host}:{bound[1]}"
        self.enabled = True

    async def stop(self) -> None:
        server, self._server = self._server, None
        self.enabled = False
        if server is not None:
            server.close()
        for conn in list(self.connections):
            conn.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def update(self, body: dict[str, Any]) -> None:
        listen = str(body.get("listen") or self.listen)
        upstream = str(body.get("upstream") or self.upstream)
        enabled = bool(body.get("enabled", self.enabled))
        if listen != self.listen or upstream != self.upstream:
            await self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled and self._server is None:
            await self.start()
        elif not enabled:
            await self.stop()

    # -- toxics ---------------------------------------------------------------------
    def toxic(self, name: str) -> Toxic:
        for toxic in self.toxics:
            if toxic.name == name:
                return toxic
        raise ProxyError("toxic not found", 404)

    def add_toxic(self, body: Any) -> Toxic:
        try:
            toxic = make_toxic(body)
        except BadToxic as exc:
            raise ProxyError(str(exc), 400) from None
        if any(t.name == toxic.name for t in self.toxics):
            raise ProxyError("toxic already exists", 409)
        self.toxics.append(toxic)
        self._changed()
        return toxic

    def update_toxic(self, name: str, body: Any) -> Toxic:
        toxic = self.toxic(name)
        if not isinstance(body, dict):
            raise ProxyError("bad request body", 400)
        try:
            toxic.update(body.get("attributes") or {})
        except BadToxic as exc:
            raise ProxyError(str(exc), 400) from None
        if "toxicity" in body:
            toxic.toxicity = float(body["toxicity"])
        self._changed()
        return toxic

    def remove_toxic(self, name: str) -> None:
        self.toxics.remove(self.toxic(name))
        self._changed()

    def reset_toxics(self) -> None:
        self.toxics.clear()
        self._changed()

    def _changed(self) -> None:
        for conn in list(self.connections):
            conn.toxics_changed()

    def _for(self, stream: str) -> list[Toxic]:
        return [t for t in self.toxics if t.stream == stream]

    # -- connections ----------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = split_address(self.upstream)
        try:
            upstream = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()  # nothing listens upstream: the client sees its connection closed
            return
        conn = Connection((reader, writer), upstream, self._for, self.connections.discard)
        self.connections.add(conn)
        conn.start()
