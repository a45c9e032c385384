"""What every private test server shares: a temp dir, a free port, start-and-wait, stop by PID.

A subclass says how to start (``command``), how to tell it is ready (``ready``; by
default: its port accepts connections) and, if it needs more, overrides ``start``/``stop``.

A server is up only once its own process holds the listening socket: between ``free_port()``
and the server's bind, another xdist worker's server can take the port, and a ``ready`` that
only connects would then pass against that other server. A first start whose port was taken
starts again on another free port (the port was the harness's choice, nobody holds it yet).

Each server's directory names the process that made it and the processes it launched (its
``owner`` file): a test run killed with SIGKILL runs no teardown, and :func:`forget_orphans`,
at the next pytest session or chaos run, stops what such a run left running and removes its
files, as ``netns.forget_orphans`` does for its network namespaces.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Self

import psutil

from tests.serve_proc import free_port


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """Process ``pid`` and every process under it stopped (SIGSTOP, what the cgroup freezer behind
    ``docker pause`` does to a container: alive, its kernel answering TCP, nothing else) for the
    ``with`` block, then resumed."""
    top = psutil.Process(pid)
    stopped = [top, *top.children(recursive=True)]
    for p in stopped:
        p.suspend()
    try:
        yield
    finally:
        for p in stopped:
            with suppress(psutil.NoSuchProcess):  # one on its way out, reaped once its parent ran
                p.resume()


OWNER = "owner"
"""A server directory's file: ``<pid> <start time>`` of the process that made it, then one line
for each process it launched."""


def _started(pid: int) -> float | None:
    """When process ``pid`` started (None: there is none), which tells a pid reused apart."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _same(pid: int, started: float) -> bool:
    at = _started(pid)
    return at is not None and abs(at - started) < 0.5


def claim(folder: Path) -> None:
    """Name this process as the maker of the server directory ``folder`` (:func:`forget_orphans`)."""
    me = os.getpid()
    (folder / OWNER).write_text(f"{me} {_started(me)}\n")


def note_launched(folder: Path, pid: int) -> None:
    """Note process ``pid`` in the ``owner`` file of the server directory ``folder``."""
    with suppress(OSError), open(folder / OWNER, "a") as f:  # a folder removed: nothing to find
        f.write(f"{pid} {_started(pid)}\n")


def forget_orphans(root: Path | None = None) -> list[Path]:
    """Stop the servers made by test processes that are gone (SIGKILLed: no teardown ran) and
    remove their directories, in ``root`` (the temp dir); the servers of a process still running
    are left alone. Stopped: every process the server launched that still runs (the same pid
    and start time), and every process naming the directory in its command line (a PostgreSQL
    that ``pg_ctl`` started). Returns the directories removed."""
    removed = []
    for owner in Path(root or tempfile.gettempdir()).glob(f"df-*/{OWNER}"):
        try:
            rows = [line.split() for line in owner.read_text().splitlines()]
            pid, started = int(rows[0][0]), float(rows[0][1])
            launched = [(int(p), float(at)) for p, at in rows[1:]]
        except (OSError, ValueError, IndexError):
            continue  # being written, or not ours
        if _same(pid, started):
            continue
        where = f"{owner.parent}/"  # the folder itself, or a path in it: not a longer name
        for p, at in launched:
            if _same(p, at):
                with suppress(ProcessLookupError):
                    if os.getpgid(p) == p:  # a session of its own (Spark's): its children too
                        os.killpg(p, signal.SIGKILL)
                    else:
                        os.kill(p, signal.SIGKILL)
        for proc in psutil.process_iter(["cmdline"]):
            if any(where in f"{arg}/" for arg in proc.info["cmdline"] or ()):
                with suppress(psutil.NoSuchProcess):
                    proc.kill()
        shutil.rmtree(owner.parent, ignore_errors=True)
        removed.append(owner.parent)
    return removed


class PortTaken(RuntimeError):
    """The server's port is held by another process."""


def _listeners(port: int) -> set[str]:
    """The ``socket:[inode]`` names of the sockets listening on ``port`` (any address)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.add(f"socket:[{fields[9]}]")
    return found


def holds_port(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a socket listening on ``port`` among its file descriptors."""
    listeners = _listeners(port)
    if not listeners:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in listeners:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


class ServerProcess:
    """One private server process; ``with Server() as s:`` starts it and removes it afterwards."""

    name = "server"
    start_timeout = 20.0

    def __init__(self, port: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"df-{self.name}-"))
        claim(self.dir)
        self.port = port or free_port()
        self.port_chosen = port is None
        """The harness picked the port, so a first start may move it; a caller's port stays."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False

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

    def launch(self) -> None:
        """Start the process without waiting for it."""
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        note_launched(self.dir, self.proc.pid)

    def start(self) -> Self:
        # A restart (an outage's end) keeps its port: proxies and sinks point at it.
        movable = self.port_chosen and not self.started
        for _ in range(3):
            self.launch()
            try:
                self.wait_for(self.ready, self.start_timeout)
            except PortTaken:
                self.kill()
                if not movable:
                    raise
                self.port = self.new_port()
                continue
            self.started = True
            return self
        raise PortTaken(f"{self.name} did not start: its port was taken three times")

    def wait_for(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll until ``ready`` holds and this server's own process holds its port; fail at once
        if the process died (:class:`PortTaken` if another process holds the port)."""
        deadline = time.monotonic() + timeout
        while not (self._holds_port() and ready()):  # never asks another server
            if self.proc is not None and self.proc.poll() is not None:
                if held := [p for p in self.ports() if _listeners(p)]:
                    raise PortTaken(f"{self.name}: port {held[0]} is held by another process")
                raise RuntimeError(f"{self.name} did not start {self.failure_detail()}".rstrip())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start {self.failure_detail()}".rstrip())
            time.sleep(0.05)

    def ports(self) -> list[int]:
        """Every port the server binds (one unless a subclass says more)."""
        return [self.port]

    def new_port(self) -> int:
        """A port for a start again after this one was taken."""
        return free_port()

    def _holds_port(self) -> bool:
        return self.proc is None or holds_port(self.proc.pid, self.port)

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
