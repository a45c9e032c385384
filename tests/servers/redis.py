"""A private redis-server (append-only file on, so a restart keeps the data)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import redis

from tests.helpers import wait_until_sync
from tests.serve_proc import ephemeral_low, free_port
from tests.servers.base import ServerProcess

BUS_OFFSET = 10_000
"""A Redis Cluster node's bus port is its port plus this."""


class Redis(ServerProcess):
    name = "redis"

    def __init__(self, password: str | None = None, cluster: bool = False) -> None:
        super().__init__()
        self.password = password
        self.cluster = cluster
        if cluster:
            self.port = self.new_port()

    def ports(self) -> list[int]:
        return [self.port, self.port + BUS_OFFSET] if self.cluster else [self.port]

    def new_port(self) -> int:
        """A cluster node binds its port and that plus 10,000 (the cluster bus): both free, and
        both below the kernel's ephemeral range, where only another bind can take them (a
        node whose bus port was taken exited, and the test failed: seen in CI)."""
        if not self.cluster:
            return free_port()
        for _ in range(200):
            port = free_port()
            if port + BUS_OFFSET >= ephemeral_low():
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + BUS_OFFSET))
                except OSError:
                    continue
            return port
        raise RuntimeError("no cluster port whose bus port is free below the ephemeral range in 200 tries")

    def command(self) -> list[str]:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always"]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(self.dir / "nodes.conf")]
        return args + (["--requirepass", self.password] if self.password else [])

    def ready(self) -> bool:
        try:
            return bool(self.client().ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def uri(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"


def restart(server: Redis) -> None:
    """Start the same server again (same port, same append-only file)."""
    server.start()


@contextlib.contextmanager
def redis_cluster() -> Iterator[tuple[Redis, Redis]]:
    """Two Redis Cluster nodes, each serving half of the hash slots."""
    with Redis(cluster=True) as a, Redis(cluster=True) as b:
        a.client().cluster("ADDSLOTSRANGE", 0, 8191)
        b.client().cluster("ADDSLOTSRANGE", 8192, 16383)
        a.client().cluster("MEET", "127.0.0.1", b.port)
        wait_until_sync(
            lambda: all(n.client().cluster("INFO").get("cluster_state") == "ok" for n in (a, b)),
            timeout=30, what="the two Redis Cluster nodes to agree",
        )  # fmt: skip
        yield a, b
