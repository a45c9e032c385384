"""File sink: JSON lines, appended and fsynced once per batch."""

from __future__ import annotations

import mmap
import os
from io import FileIO
from pathlib import Path
from typing import Literal

from pydantic import Field

from actors import in_thread
from deltaforge.configmodel import Bool, SinkConfig, SinkSettings, Text
from deltaforge.envelopes import encode_lines
from deltaforge.events import Event
from deltaforge.position import Position
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, Sink


class FileSinkConfig(SinkSettings):
    """JSON lines appended to a file."""

    path: Text = Field(description="The file (its folder is created).")
    fsync: Bool = Field(True, description="fsync after each batch (the batch is durable only then).")
    page_cache: Literal["drop", "keep"] = Field(
        "drop",
        description="drop: a batch's pages leave the page cache once fsynced (written once, read "
        "elsewhere: they evict nothing, and the next batch reuses their memory); keep: for a "
        "reader tailing the file on this machine. With fsync false, pages are kept.",
    )


class FileSink(Sink[FileSinkConfig]):
    """Appends one envelope per line to ``path``; the batch is durable after fsync."""

    def __init__(self, config: SinkConfig[FileSinkConfig]) -> None:
        super().__init__(config)
        self.path = Path(self.settings.path)
        self.fsync = self.settings.fsync
        self.drop_pages = self.fsync and self.settings.page_cache == "drop"
        self._file: FileIO | None = None

    async def open(self) -> None:
        """A folder that cannot be made or a file that cannot be opened (a mount not there yet,
        permissions) is waited for as a write that fails is: the operator's fix needs no restart;
        a path that names a folder stops the pipeline, saying so. Either crashed the worker, and
        the pipeline failed after its restarts, ``/health`` ok meanwhile."""
        try:
            await in_thread(self._open)
        except IsADirectoryError:  # the config names a folder: no wait makes it a file
            raise NonRetryableSinkError(
                f"file sink {self.id!r}: {self.path} is a folder; path names the file to write"
            ) from None
        except OSError as exc:
            raise RetryableSinkError(f"file sink {self.id!r}: cannot open {self.path}: {exc}") from exc

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        created = not self.path.exists()
        # Unbuffered: a failed write leaves nothing behind in a Python buffer to be flushed later.
        self._file = FileIO(self.path, "ab")
        if created and self.fsync:
            _fsync_dir(self.path.parent)  # the new file's name is durable only once its folder is

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        data = encode_lines(events, self.config.envelope)
        try:
            await in_thread(self._write, data)
        except OSError as exc:
            raise RetryableSinkError(f"file sink {self.id!r}: cannot write {self.path}: {exc}") from exc

    def _write(self, data: bytes) -> None:
        if self._file is not None and self._moved(self._file):
            self._file.close()
            self._file = None
        if self._file is None:
            self._open()
        f = self._file
        assert f is not None
        start = os.fstat(f.fileno()).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[f.write(view) or 0 :]
            if self.fsync:
                os.fsync(f.fileno())
                if self.drop_pages:
                    _drop_pages(f.fileno(), start)
        except OSError:
            # A batch is all or nothing: cut what this attempt wrote, so the retry (which
            # writes the whole batch again) leaves neither duplicates nor a torn line.
            try:
                os.ftruncate(f.fileno(), start)
            except OSError:
                self._file = None  # reopened next time, and the torn tail dropped then
                f.close()
            raise

    def _moved(self, f: FileIO) -> bool:
        """Whether ``path`` no longer names the file open: renamed (a rotation) or removed. Left
        open, the batches would go to the rotated file, or to one no one can open any more."""
        try:
            at = os.stat(self.path)
        except FileNotFoundError:
            return True
        own = os.fstat(f.fileno())
        return (at.st_ino, at.st_dev) != (own.st_ino, own.st_dev)

    async def close(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            await in_thread(f.close)


def _drop_pages(fd: int, start: int) -> None:
    """Drop the file's pages from ``start``'s page to its end from the page cache: clean once
    fsynced, nobody here reads them again. Kept, a drain fills memory with output written
    once, evicting what the machine does read (a database's own cache); and each batch takes
    pages the kernel has not used lately, which on a virtual machine that hands free memory
    back to its host cost a fault in the host each (docs/performance.md). From the whole first
    page: the kernel keeps a range's partial pages. An advice refused (a pipe, a platform
    without it) changes nothing."""
    try:
        os.posix_fadvise(fd, start - start % mmap.PAGESIZE, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a crash left half-written.

    That line belongs to a batch that was never acknowledged, so it will be
    delivered again whole; keeping the torn copy would leave invalid JSON.
    """
    if not path.exists():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        block = 1 << 16
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(start + nl + 1)
                break
            pos = start
        else:
            f.truncate(0)
        f.flush()
        os.fsync(f.fileno())
