"""MySQL/MariaDB source: row events from the binlog via python-mysql-replication.

The binlog is decoded in a child process (``binlog_process.py``) so that the
library's pure-Python decoding runs beside the event loop instead of sharing
its GIL. A thread here reads the child's frames, turns whole transactions into
events and hands them over through a bounded queue; when the queue is full the
thread stops reading, the pipe fills, the child blocks and stops reading the
replication socket — backpressure all the way to the server.

Positions: MariaDB resumes by GTID (``auto_position``), MySQL by file/pos.
Every event's order is ``(binlog file number, end position of its row event,
row index)``; the last event of a transaction is checkpointed at its XID event,
so a resume starts exactly after the committed transaction.
"""

from __future__ import annotations

import pickle
import queue
import signal
import subprocess
import sys
import threading
from typing import Any

from actors import BlockingRunner
from deltaforge.events import Event, SourceInfo
from deltaforge.sources.base import PositionLost, Source, SourceError
from deltaforge.sources.binlog_process import read_frame
from deltaforge.sources.mysql_checks import (
    MySQLSettings,
    ServerInfo,
    binlog_index,
    check_position,
    check_preconditions,
    default_server_id,
    earliest_position,
)

SchemaChange = tuple[str, list[dict[str, Any]], dict[str, Any]]


class MySQLSource(Source):
    """Row changes from a MySQL 8 or MariaDB binlog."""

    connector = "mysql"

    def __init__(self, config: dict[str, Any], tenant: str = "default") -> None:
        self.id: str = config["id"]
        self.settings = MySQLSettings.from_dsn(str(config["dsn"]))
        self.patterns = [tuple(t.split(".", 1)) for t in config.get("tables", [])]
        self.server_id = int(config.get("server_id") or default_server_id(self.id))
        self.chunk = int(config.get("read_chunk", 2000))
        self.tenant = tenant
        self.info: ServerInfo | None = None
        self._queue: queue.Queue[list[Event] | BaseException] = queue.Queue(maxsize=8)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._schema_changes: list[SchemaChange] = []
        self._lock = threading.Lock()
        self._threads = BlockingRunner(1)

    @staticmethod
    def order_of(checkpoint: dict[str, Any]) -> tuple[int, ...]:
        return (
            binlog_index(str(checkpoint.get("file", ""))),
            int(checkpoint.get("pos", 0)),
            int(checkpoint.get("row", 0)),
        )

    @property
    def idle_wait(self) -> float:
        return 0.0  # read() itself waits on the queue

    # -- lifecycle ---------------------------------------------------------------
    async def open(self, resume_after: dict[str, Any] | None) -> None:
        self.info, start = await self._threads.run(self._prepare, resume_after)
        if resume_after is None:
            # No checkpoint: the earliest change still on the server (there is no snapshot yet).
            resume_after = start
        self._stop.clear()
        self._queue = queue.Queue(maxsize=8)
        # Spawned from the loop's own thread: PR_SET_PDEATHSIG fires when the *thread* that
        # forked the child ends, and pool threads end when idle.
        self._child = self._spawn(resume_after)
        self._thread = threading.Thread(
            target=self._pump, args=(self._child, resume_after), name=f"mysql-binlog-{self.id}", daemon=True
        )
        self._thread.start()

    def _prepare(self, resume_after: dict[str, Any] | None) -> tuple[ServerInfo, dict[str, Any]]:
        conn = self.settings.connect()
        try:
            info = check_preconditions(conn, self.settings.where)
            if resume_after:
                check_position(conn, resume_after, info)
            return info, earliest_position(conn, info)
        finally:
            conn.close()

    def _spawn(self, resume_after: dict[str, Any] | None) -> subprocess.Popen[bytes]:
        assert self.info is not None
        cfg = {
            "connection": self.settings.replication(),
            "server_id": self.server_id,
            "is_mariadb": self.info.is_mariadb,
            "resume": resume_after,
            "patterns": self.patterns,
            "schemas": sorted({p[0] for p in self.patterns if not any(ch in p[0] for ch in "*?[")}),
            "chunk": self.chunk,
        }
        child = subprocess.Popen(
            [sys.executable, "-m", "deltaforge.sources.binlog_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=1 << 20,
        )
        assert child.stdin is not None
        child.stdin.write(pickle.dumps(cfg))  # settings (with the password) go through a pipe, not argv
        child.stdin.close()
        return child

    async def close(self) -> None:
        self._stop.set()
        child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGKILL)
        if self._thread is not None:
            thread, self._thread = self._thread, None
            await self._threads.run(thread.join, 5.0)
        if child is not None:
            await self._threads.run(child.wait)
            if child.stdout is not None:
                child.stdout.close()

    async def read(self) -> list[Event]:
        item = await self._threads.run(self._next_chunk)
        if isinstance(item, BaseException):
            raise item
        return item

    def _next_chunk(self) -> list[Event] | BaseException:
        try:
            out = self._queue.get(timeout=0.2)
        except queue.Empty:
            return []
        if isinstance(out, BaseException):
            return out
        while len(out) < self.chunk:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(more, BaseException):
                self._queue.put(more)  # report it on the next read, after these events
                break
            out = out + more
        return out

    def take_schema_changes(self) -> list[SchemaChange]:
        with self._lock:
            changes, self._schema_changes = self._schema_changes, []
        return changes

    # -- the pump thread ---------------------------------------------------------------
    def _put(self, item: list[Event] | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _pump(self, child: subprocess.Popen[bytes], resume_after: dict[str, Any] | None) -> None:
        assert child.stdout is not None
        committed = str(resume_after.get("gtid", "")) if resume_after else ""
        try:
            while not self._stop.is_set():
                frame = read_frame(child.stdout)
                kind = frame[0]
                if kind == "txs":
                    events, committed = self._events(frame[1], committed)
                    if events:
                        self._put(events)
                elif kind == "schema":
                    with self._lock:
                        self._schema_changes.append((frame[1], frame[2], frame[3]))
                elif kind == "error":
                    if frame[1] == "position_lost":
                        raise PositionLost(
                            f"the server cannot serve the binlog from the checkpoint ({frame[2]})"
                        )
                    raise SourceError(f"mysql source {self.id!r} ({self.settings.where}): {frame[2]}")
        except BaseException as exc:  # noqa: BLE001 - everything is handed to the actor
            if self._stop.is_set():
                return
            if isinstance(exc, EOFError):
                code = child.poll()
                exc = SourceError(f"mysql source {self.id!r}: binlog decoder exited (code {code})")
            self._put(exc)

    def _events(self, txs: list[tuple[Any, ...]], committed: str) -> tuple[list[Event], str]:
        out: list[Event] = []
        connector, tenant = self.connector, self.tenant
        for gtid, file, end_pos, rows in txs:
            fidx = binlog_index(file)
            last = len(rows) - 1
            tx_id = gtid or f"{file}:{end_pos}"
            for n, (op, schema, table, pos, i, ts, before, after) in enumerate(rows):
                position = {"file": file, "pos": pos, "row": i, "gtid": committed}
                end = n == last
                out.append(
                    Event(
                        op,
                        before,
                        after,
                        SourceInfo(connector, schema, table, position, ts * 1000),
                        tx_id,
                        end,
                        f"{fidx}:{pos}:{i}",
                        (fidx, pos, i),
                        {"file": file, "pos": end_pos, "row": 0, "gtid": gtid} if end else position,
                        tenant,
                        128 + 32 * len(after or before or ()),
                    )
                )
            committed = gtid
        return out, committed
