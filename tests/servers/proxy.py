"""A TCP proxy in front of a test server that can be taken down and brought back, to stage an
outage of a server that cannot be restarted without losing its data (Tansu keeps its data in
memory). Down means: listening socket closed, every open connection reset. Frozen means: every
open connection passes nothing more and is never closed, while new ones pass as before (what a
client sees of a server whose host vanished, or of a connection a NAT forgot, once the name
leads to a server that answers). Refusing means: listening socket closed, open connections left
as they are (with a freeze: a host whose connections went silent and whose port now refuses). ``forget_idle(s)`` does that to each connection idle for ``s``,
as a NAT or firewall forgets an idle connection: a question asked on it later waits for ever. With ``tls``, clients
talk TLS to the proxy and it talks plain TCP to the server (a server that cannot do TLS itself)."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Collection
from concurrent.futures import Future

from tests.serve_proc import free_port


class TcpProxy:
    def __init__(
        self, upstream_port: int, port: int | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.upstream_port = upstream_port
        self.tls = tls
        self.port = port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._links: dict[
            asyncio.Future[tuple[None, None]], tuple[list[float], set[asyncio.StreamWriter]]
        ] = {}
        """Each open connection's last byte (either way) and its two ends."""
        self._replies: dict[asyncio.Future[tuple[None, None]], asyncio.Future[None]] = {}
        """Each open connection's copy of what the server sends (see :meth:`hold`)."""
        self.forgotten = 0
        """Connections frozen for idling (``forget_idle``)."""
        self.accepted = 0
        """Connections taken, since the start."""
        self.asked = 0
        """Reads passed from a client to the server, since the start: a question asked after
        :meth:`hold` shows here, though its answer never comes."""

    def _call(self, coro: object) -> None:
        fut: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        fut.result(10)

    def start(self) -> TcpProxy:
        self._thread.start()
        self.up()
        return self

    def up(self) -> None:
        self._call(self._listen())

    def down(self) -> None:
        self._call(self._close())

    def refuse(self) -> None:
        """The listening socket closed, every open connection left as it is (frozen or not): a
        new connection is refused at once, :meth:`up` takes them again."""
        self._call(self._refuse())

    async def _refuse(self) -> None:
        if self._server is not None:
            # Not waited for: from Python 3.12, wait_closed waits for the open connections too,
            # which a refusal leaves open (down() resets them, then waits).
            self._server.close()
            self._server = None

    def freeze(self, spare: Collection[int] = ()) -> None:
        """Every open connection, from now on, silent both ways and left open; but those whose
        port, as the server sees it (``client_port`` in ``pg_stat_replication``, ``HOST`` in
        MariaDB's process list), is in ``spare``: a test that stages the silence of one kind of
        connection leaves the others, with their own rules for it, alone."""
        self._call(self._freeze(frozenset(spare)))

    def hold(self) -> None:
        """Every open connection, from now on, passes nothing more from the server to the client
        (a client that stopped reading), while what the client sends still reaches the server:
        a question asked now is answered into buffers nobody empties, and a server writing a
        long answer waits on its socket (``ClientWrite``), for certain."""
        self._call(self._hold())

    async def _hold(self) -> None:
        for replies in self._replies.values():
            replies.cancel()  # its copy stops reading; the socket stays open

    def forget_idle(self, idle_s: float) -> None:
        """From now on, freeze each connection as soon as it has passed nothing for ``idle_s``."""
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._forget(idle_s)))

    async def _forget(self, idle_s: float) -> None:
        while True:
            now = self._loop.time()
            for pipe, (last, ends) in list(self._links.items()):
                if now - last[0] >= idle_s:
                    self._held |= ends
                    self._writers -= ends
                    self._links.pop(pipe, None)
                    pipe.cancel()
                    self.forgotten += 1
            await asyncio.sleep(idle_s / 10)  # a NAT's own sweep: how often idle entries are dropped

    def stop(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._pipe_client, "127.0.0.1", self.port, reuse_address=True, ssl=self.tls
        )

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers | self._held):
            w.transport.abort()  # a reset, as when the server's host goes away
        self._writers.clear()
        self._held.clear()

    async def _freeze(self, spare: frozenset[int]) -> None:
        for pipe, (_, ends) in list(self._links.items()):
            if not spare & {w.get_extra_info("sockname")[1] for w in ends}:
                self._held |= ends
                self._writers -= ends
                self._links.pop(pipe, None)
                pipe.cancel()  # its copies stop reading; its sockets stay open (in _held)

    async def _pipe_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        last = [self._loop.time()]
        replies = asyncio.ensure_future(self._copy(up_reader, writer, last))
        pipe = asyncio.gather(self._copy(reader, up_writer, last, asks=True), replies)
        self._links[pipe] = (last, {writer, up_writer})
        self._replies[pipe] = replies
        try:
            await pipe
        except asyncio.CancelledError:
            pass  # frozen
        finally:
            self._links.pop(pipe, None)
            self._replies.pop(pipe, None)

    async def _copy(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        last: list[float],
        asks: bool = False,
    ) -> None:
        try:
            while data := await reader.read(65536):
                last[0] = self._loop.time()
                self.asked += asks
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            return  # frozen: the socket stays open, in _held
        self._writers.discard(writer)
        writer.transport.abort()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
