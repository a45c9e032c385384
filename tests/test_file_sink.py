"""File sink: a batch is in the file whole or not at all, and a new file's name is made durable."""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from deltaforge.config import parse_pipeline
from deltaforge.sinks.base import RetryableSinkError
from deltaforge.sinks.file import FileSink
from tests.kit import make_event, sink_pipeline


def file_sink(path: Path, **settings: Any) -> FileSink:
    cfg = parse_pipeline(sink_pipeline("f", "file", {"id": "f", "path": str(path), **settings}), env={})
    return FileSink(cfg.sinks[0])


def pages_cached(path: Path) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages it has), by mincore(2) on a mapping of it,
    which reads nothing in."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    int_ = ctypes.c_int
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, int_, int_, int_, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


@pytest.fixture
def file_size_limit() -> Iterator[None]:
    """RLIMIT_FSIZE makes writes past a size fail (EFBIG), as a full disk fails them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a signal that kills pytest
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


async def test_a_batch_that_fails_half_written_is_cut_back_so_the_retry_leaves_it_once(
    tmp_path: Path, file_size_limit: None
) -> None:
    path = tmp_path / "out.jsonl"
    sink = file_sink(path)
    await sink.open()
    first = [make_event(i, payload="p" * 100) for i in range(1, 11)]
    await sink.deliver(first)
    size = path.stat().st_size
    second = [make_event(i, payload="p" * 100) for i in range(11, 51)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1500, resource.RLIM_INFINITY))  # room for a few lines
    with pytest.raises(RetryableSinkError, match="cannot write"):
        await sink.deliver(second)
    assert path.stat().st_size == size  # nothing of the failed attempt is left
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    await sink.deliver(second)  # the retry: the same batch, whole
    await sink.close()
    lines = path.read_bytes().splitlines()
    ids = [int(orjson.loads(line)["event_id"]) for line in lines]  # every line is whole JSON
    assert ids == list(range(1, 51))  # once each: no duplicates from the failed attempt


async def test_a_new_file_is_made_durable_with_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_mode)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    sink = file_sink(tmp_path / "new" / "out.jsonl")
    await sink.open()
    await sink.deliver([make_event(1)])
    await sink.close()
    assert any(stat.S_ISDIR(mode) for mode in synced)  # the folder that got the new name
    assert any(stat.S_ISREG(mode) for mode in synced)  # the batch


async def test_a_file_rotated_or_removed_under_the_sink_gets_the_next_batch_at_its_path(
    tmp_path: Path,
) -> None:
    """The sink kept writing to the file it had opened: after a rotation (the file renamed, as
    logrotate does) the next batches went to the rotated file and none to ``path``; after the
    file was removed, to a file no one can open any more, acknowledged and checkpointed all the
    same. Each batch now goes to the file at ``path``, made again if it is gone."""

    def ids(path: Path) -> list[int]:
        return [orjson.loads(line)["after"]["seq"] for line in path.read_bytes().splitlines()]

    out = tmp_path / "events.jsonl"
    sink = file_sink(out)
    await sink.open()
    await sink.deliver([make_event(1), make_event(2)])
    out.rename(tmp_path / "events.jsonl.1")
    await sink.deliver([make_event(3)])
    rotated = ids(tmp_path / "events.jsonl.1")
    out.unlink()
    await sink.deliver([make_event(4)])
    await sink.close()
    assert rotated == [1, 2]
    assert ids(out) == [4]
    assert ids(tmp_path / "events.jsonl.1") == [1, 2]


async def test_a_folder_that_cannot_be_made_is_waited_for_not_a_crash(tmp_path: Path) -> None:
    """A file where the sink's folder should be (as a mount not there yet, or permissions, stop
    it): opening raised the filesystem's own error, which crashed the delivery worker and, after its
    restarts, failed the pipeline with ``/health`` ok meanwhile. It is retryable now, naming the
    path, and the next open after the fix writes."""
    (tmp_path / "out").write_text("in the way")
    sink = file_sink(tmp_path / "out" / "events.jsonl")
    with pytest.raises(RetryableSinkError) as raised:
        await sink.open()
    assert str(raised.value).startswith(f"file sink 'f': cannot open {tmp_path / 'out' / 'events.jsonl'}: ")
    (tmp_path / "out").unlink()
    await sink.open()
    await sink.deliver([make_event(1)])
    await sink.close()
    assert (tmp_path / "out" / "events.jsonl").read_bytes().count(b"\n") == 1


@pytest.mark.parametrize("page_cache", ["drop", "keep"])
async def test_a_fsynced_batch_leaves_the_page_cache_unless_told_to_keep_it(page_cache: str) -> None:
    """Output written once filled the page cache as it was written (evicting what the machine
    reads, a database's cache), and each batch took memory the kernel had not used lately (on
    a virtual machine, much slower to write into: docs/performance.md). Once fsynced, a
    batch's pages are dropped, each batch's first page included, which the one before had
    partly written; ``keep`` keeps them, for a reader tailing the file here. In /var/tmp: a
    tmpfs keeps its pages whatever it is told."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        path = Path(tmp) / "out.jsonl"
        sink = file_sink(path, page_cache=page_cache)
        await sink.open()
        for start in (1, 101, 201):  # lines across page boundaries: batches share pages
            await sink.deliver([make_event(i, payload="p" * 333) for i in range(start, start + 100)])
        await sink.close()
        cached, pages = pages_cached(path)
        assert pages >= 20
        assert cached == (0 if page_cache == "drop" else pages)
        assert len(path.read_bytes().splitlines()) == 300  # and every line is there
