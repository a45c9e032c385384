"""Whether the binlog a sink behind still needs is about to go, said before it goes.

The server keeps its binlog for ``binlog_expire_logs_seconds`` (``expire_logs_days``), or until
a DBA purges it, whatever a reader still needs. Reading resumes from the position every sink
holds durably (the checkpoint the source is told with ``confirm``), so a sink behind (an optional
sink lagging, a required one down) needs the binlog from there on: by GTID, from the file holding
the first transaction after that position (a file of older transactions only may go); by file,
the checkpoint's own file. Once that file is purged, the next opening is ``position lost``.
PostgreSQL's slot keeps its WAL instead (``postgres/retention.py``); here the warning comes from
the file list, every ``every_s`` while reading:

* ``binlog_at_risk`` (warning) when the file needed is the oldest the server has left, with newer
  ones, on two looks in a row: the next expiry or ``PURGE BINARY LOGS`` takes it;
* ``binlog_purged_under_checkpoint`` (error) when it is gone already: reading goes on from where
  it is, and the next opening (a restart, a reconnect) halts as position lost, or, for optional
  sinks alone, gives them a snapshot;
* the bytes of binlog from the checkpoint on, for ``deltaforge_source_retained_bytes``;
* ``reset`` when the file the reader is in is shorter than what was read from it: the binlog was
  reset (``RESET MASTER``) while the reader was in ``mysql-bin.000001``, and the server goes on in
  a new file of that name. The dump thread, at its position in the old file, then waits there for
  ever without an error (probed on MariaDB 10.11; from any other file it fails at once, and the
  reader says position lost), so nothing else would say that nothing more arrives.

A pipeline caught up needs no file by GTID: the newest file's GTID list serves its position.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from deltaforge.sources.mysql.position import BinlogPosition, binlog_index

_HELD = (
    "reading resumes from the position every sink holds durably: a sink behind (an optional sink "
    "lagging, a required one down) needs the binlog from there on"
)


class BinlogRetention:
    """The binlog files from the durable checkpoint on (see the module)."""

    every_s = 30.0

    def __init__(self, source: str, by_file: bool) -> None:
        self.source = source
        self.by_file = by_file
        self.held: BinlogPosition | None = None
        """The position every sink holds durably, as last confirmed."""
        self.retained: int | None = None
        """The binlog bytes from ``held`` on at the last look (None: not looked at yet)."""
        self.looks = 0
        self._read_in: dict[
            str, BinlogPosition
        ] = {}  # per file, the position after the last event read in it
        self._next = 0.0
        self._oldest_before: str | None = None  # the file needed, when it was the oldest at the last look
        self._said: str | None = None  # the file last warned about, and how
        self.reset: str | None = None
        self.gen = 0
        """The generation of the last opening (``BinlogPosition.gen``)."""
        """Why the binlog the reader is in is not the one it was reading (see the module)."""

    def opened(self, gen: int) -> None:
        """Reading starts again (a reconnect, a rewind, from now after a lost position) in
        generation ``gen``. In another generation (a failover, a reset) what was read before, and
        the checkpoint held, name files of another history (after a reset, a file of the same
        name); in the same one they still say which files a sink behind needs."""
        self.reset = None
        if gen != self.gen:
            self.gen = gen
            self._read_in.clear()
            if self.held is not None and self.held.gen != gen:
                self.held = None

    def confirmed(self, held: BinlogPosition) -> None:
        self.held = held
        first = binlog_index(held.file)
        for name in [f for f in self._read_in if binlog_index(f) < first]:
            del self._read_in[name]

    def read(self, first: BinlogPosition, last: BinlogPosition) -> None:
        """A chunk of events was read, from ``first`` to ``last`` (their positions after them)."""
        if first.file != last.file:  # a rotation within the chunk: the earlier file's last is not known
            self._read_in.setdefault(first.file, first)
        self._read_in[last.file] = last

    def due(self) -> bool:
        """Whether a look is due (and, if so, the next one is not before ``every_s``)."""
        if self.held is None or time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + self.every_s
        return True

    def needed(self, read_in: dict[str, BinlogPosition] | None = None) -> str | None:
        """The oldest binlog file a resume from ``held`` needs (None: none, caught up), from
        ``read_in`` (a copy of what was read per file; by default taken now)."""
        held = self.held
        if held is None:
            return None
        if self.by_file:
            return held.file
        # Never the live dict: the look runs in a worker thread while the reader adds to it.
        read = dict(self._read_in) if read_in is None else read_in
        after = [f for f, at in read.items() if at.order > held.order]
        return min(after, key=binlog_index) if after else None

    def check(self, conn: Any) -> None:
        """Read the server's binlog files and say what changed since the last look (blocking:
        in a worker thread)."""
        held = self.held
        if held is None:
            return
        # What was read before the question: the server wrote it before sending it, so no file's
        # size in the answer can be smaller. The reader goes on meanwhile (this runs in a worker
        # thread), and what it reads after the answer may lie past the sizes it gives.
        read_before = dict(self._read_in)  # one C call: a copy the reader's thread cannot cut into
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
        self.looks += 1
        if not files:
            return
        names = [name for name, _ in files]
        self._check_reset(dict(files), read_before)
        since = [(n, size) for n, size in files if binlog_index(n) >= binlog_index(held.file)]
        skip = held.resume_pos if since and since[0][0] == held.file else 0
        self.retained = max(sum(size for _, size in since) - skip, 0)
        needed = self.needed(read_before)
        log = structlog.get_logger()
        if needed is not None and needed not in names and binlog_index(needed) < binlog_index(names[0]):
            if self._said != f"purged {needed}":
                self._said = f"purged {needed}"
                log.error(
                    "binlog_purged_under_checkpoint", actor="MySQLSource", source=self.source, file=needed,
                    oldest=names[0], checkpoint=held.to_doc(),
                    reason=_HELD + "; that file was purged, so the next opening (a restart, a reconnect) "
                    "halts as position lost (optional sinks alone behind: they are given a snapshot)",
                )  # fmt: skip
            return
        oldest = needed is not None and needed == names[0] and len(names) > 1
        if oldest and self._oldest_before == needed and self._said != f"oldest {needed}":
            self._said = f"oldest {needed}"
            log.warning(
                "binlog_at_risk", actor="MySQLSource", source=self.source, file=needed,
                files_after=len(names) - 1, retained_mb=self.retained >> 20, checkpoint=held.to_doc(),
                reason=_HELD + "; it is in the oldest binlog file the server has left, so the next expiry "
                "(binlog_expire_logs_seconds) or PURGE BINARY LOGS takes it, and the next opening then halts "
                "as position lost (GET /pipelines/<name> says which sinks lag)",
            )  # fmt: skip
        self._oldest_before = needed if oldest else None

    def _check_reset(self, sizes: dict[str, int], read: dict[str, BinlogPosition]) -> None:
        """A file the server lists as shorter than a position read from it (``read``: before the
        server was asked) was replaced: the server had written at least that much of it before
        sending the events."""
        for name, at in read.items():
            if name in sizes and sizes[name] < at.pos:
                self.reset = (
                    f"binlog file {name} holds {sizes[name]} bytes, fewer than the {at.pos} deltaforge read "
                    "from it: the binlog was reset (RESET MASTER) or replaced under the reader, and the "
                    "server's changes since go to a new file the reader will never see"
                )
