"""The API's HTTP server: uvicorn on sockets ``listen.bind`` has already bound."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``serve`` drains pipelines first."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


async def serve_on(
    app: Any, sockets: list[socket.socket]
) -> tuple[uvicorn.Server, asyncio.Task[None]] | None:
    """Serve ``app`` on ``sockets``; the server and its task once it accepts, None if it cannot."""
    # log_config None: uvicorn's own warnings reach the JSON log (logsetup), not bare text on stderr
    server = _Server(uvicorn.Config(app, log_level="warning", log_config=None))

    async def run() -> None:
        try:
            await server.serve(sockets=sockets)
        except SystemExit:  # uvicorn exits the process when its start-up fails: only this server ends
            pass

    task = asyncio.create_task(run())
    while not server.started and not task.done():
        await asyncio.sleep(0.01)  # uvicorn has no start-up callback: its own flag, polled
    return None if task.done() else (server, task)
