"""One process at a time runs a pipeline on a checkpoint store.

Two processes running one pipeline (a unit started twice, a second terminal on the same config)
read the same binlog and deliver every change twice; their checkpoint writes race, and a file
sink of one cuts back before a retry what the other appended after it. (PostgreSQL's slot and
Turso's file lock let only one read, and the other failed over and over.) The first process to
start a pipeline holds an exclusive ``flock`` on a file beside the store,
``<store>.<pipeline>.lock``, which names it (pid and host); the kernel lets go of it when that
process ends, however it ends (a SIGKILL too). A second one waits, ``degraded`` and naming the
holder, and takes over once the lock is free: a standby, not a failure. A store in memory is no
one else's, and needs none.

The lock is advisory and local: on a network file system ``flock`` may not reach other
machines (NFS emulates it with byte-range locks on Linux; other systems may not).

>>> import tempfile, os
>>> store = os.path.join(tempfile.mkdtemp(), "deltaforge.db")
>>> one, two = RunLock(store, "orders"), RunLock(store, "orders")
>>> one.acquire(), two.acquire()
(True, False)
>>> two.holder() == f"pid {os.getpid()} on {socket.gethostname()}"
True
>>> one.release(); two.acquire()
True
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from urllib.parse import quote

import structlog

from deltaforge.pipeline.availability import Availability
from supervision import Clock

LOOK_S = 1.0
"""How often a pipeline that another process runs looks whether that one has stopped."""


class RunLock:
    """The lock on ``<store>.<pipeline>.lock`` (the pipeline's name percent-encoded), taken without
    waiting by :meth:`acquire`, named by :meth:`holder`."""

    def __init__(self, store_path: str, pipeline: str) -> None:
        store = Path(store_path)
        self.path = store.with_name(f"{store.name}.{quote(pipeline, safe='')}.lock")
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if no process holds it (this one included, through another RunLock)."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock is held all the same, only its holder's name is missing
        return True

    async def wait(self, availability: Availability, clock: Clock, log: structlog.stdlib.BoundLogger) -> None:
        """Until this process holds the lock: meanwhile ``run_lock`` is listed unavailable (the
        pipeline ``degraded``) naming the holder, and ``pipeline_held_elsewhere`` said once."""
        said = False
        while True:
            try:
                if self.acquire():
                    break
            except OSError as exc:  # the file cannot be made (a full disk): waited for, as the store is
                why = f"cannot open the run lock {self.path}: {type(exc).__name__}: {exc}"
            else:
                holder = self.holder()
                why = f"pipeline run by another process ({holder}): waiting for it to stop"
                if not said:
                    said = True
                    log.warning("pipeline_held_elsewhere", held_by=holder, lock=str(self.path))
            availability.down("run_lock", why)
            await clock.sleep(LOOK_S)
        availability.up("run_lock")

    def holder(self) -> str:
        """Who holds the lock, as it wrote itself down ("unknown" between its lock and its write, or
        when a full disk refused the write)."""
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        """Let go (closing the file lets go of the lock); the file stays, for the next holder."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
