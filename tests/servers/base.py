"""What every private test server shares: a temp dir, a free port, start-and-wait, stop by PID.

A subclass says how to start (``command``), how to tell it is ready (``ready``; by
default: its port accepts connections) and, if it needs more, overrides ``start``/``stop``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from tests.serve_proc import free_port


class ServerProcess:
    """One private server process; ``with Server() as s:`` starts it and removes it afterwards."""

    name = "server"
    start_timeout = 20.0

    def __init__(self, port: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"df-{self.name}-"))
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def failure_detail(self) -> str:
        """What to show when it does not start (a log tail)."""
        return ""

    def start(self) -> Self:
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_for(self.ready, self.start_timeout)
        return self

    def wait_for(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll ``ready`` until it holds; fail at once if the process died."""
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                raise RuntimeError(f"{self.name} did not start {self.failure_detail()}".rstrip())
            time.sleep(0.05)

    def kill(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        """Stop the process by PID (SIGKILL when it ignores ``sig`` past ``timeout``); the data stays."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()  # a half-started server: its process and its files go too
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
