"""A private redis-server (append-only file on, so a restart keeps the data)."""

from __future__ import annotations

import redis

from tests.servers.base import ServerProcess


class Redis(ServerProcess):
    name = "redis"

    def __init__(self, password: str | None = None) -> None:
        super().__init__()
        self.password = password

    def command(self) -> list[str]:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always"]  # fmt: skip
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
