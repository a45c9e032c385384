"""PostgreSQL's streaming replication protocol for one logical slot, over libpq.

``START_REPLICATION SLOT … LOGICAL`` pushes pgoutput messages as transactions
commit; nothing is read twice, however far a sink lags behind. The slot's
``confirmed_flush_lsn`` moves only through :meth:`LogicalStream.confirm`, with
exactly the position the caller names — never further. (psycopg2's
``LogicalReplicationConnection`` moves it on to the keepalive's WAL end by
itself; the stored checkpoint would then trail the slot, and the next start
could not tell that from changes consumed elsewhere.)

psycopg's ``pq`` module is a thin libpq binding: it speaks COPY BOTH, which
asyncpg cannot. This module is blocking; it runs in the decoder process.

Message formats: https://www.postgresql.org/docs/15/protocol-replication.html
"""

from __future__ import annotations

import select
import struct
import time

from psycopg import pq
from psycopg.conninfo import make_conninfo

XLOG_DATA = struct.Struct(">QQq")  # after b"w": data start, WAL end, send time
KEEPALIVE = struct.Struct(">QqB")  # after b"k": WAL end, send time, reply requested
STATUS = struct.Struct(">cQQQqB")  # b"r", written, flushed, applied, client time, reply requested
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
STATUS_EVERY_S = 10.0  # well inside the default wal_sender_timeout (60 s)
UNAVAILABLE_STATES = ("08", "57P01", "57P02", "57P03", "53300")  # connection, shutdown, starting up


class StreamError(Exception):
    """The server refused or ended the stream; ``sqlstate`` says why (None: the connection)."""

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate

    @property
    def unavailable(self) -> bool:
        """Down, restarting or unreachable: worth waiting for."""
        return self.sqlstate is None or self.sqlstate.startswith(UNAVAILABLE_STATES)

    @property
    def slot_missing(self) -> bool:
        return self.sqlstate == "42704"

    @property
    def slot_busy(self) -> bool:
        return self.sqlstate == "55006"


class LogicalStream:
    """One replication connection streaming one slot with pgoutput."""

    def __init__(self, dsn: str, session: dict[str, str], silence_s: float = 0.0) -> None:
        options = " ".join(f"-c {k}={v.replace(' ', '')}" for k, v in session.items())
        conninfo = make_conninfo(
            dsn,
            replication="database",
            options=options,
            connect_timeout=10,
            application_name="deltaforge stream",
        )
        self.pg = pq.PGconn.connect(conninfo.encode())
        if self.pg.status != pq.ConnStatus.OK:
            message = _text(self.pg.error_message)
            self.pg.finish()
            raise StreamError(f"cannot connect: {message}", _connect_state(message))
        self.wal_end = 0
        """The server's decoding position from its last keepalive: everything before it was sent."""
        self.received = 0
        self.flushed = 0
        self._last_status = 0.0
        self.silence_s = silence_s
        """A reply asked for and nothing at all heard for this long (0: never) means the
        connection is lost: PostgreSQL's own receivers' rule (``wal_receiver_timeout``). A
        network that drops packets without closing is noticed in that time, instead of after
        TCP's minutes of retransmissions; a busy walsender still sends keepalives."""
        self._asked_at: float | None = None  # the oldest reply request not answered yet
        self._ended: StreamError | None = None
        """How the stream ended, once the messages read before the end have been handed over."""

    def start(self, slot: str, publication: str, from_lsn: int) -> None:
        """Begin streaming; the server starts at the slot's confirmed position (or ``from_lsn``)."""
        pub = publication.replace("'", "''").replace('"', '""')
        command = (
            f'START_REPLICATION SLOT "{slot}" LOGICAL {from_lsn >> 32:X}/{from_lsn & 0xFFFFFFFF:X} '
            f"(proto_version '1', publication_names '\"{pub}\"', messages 'true')"
        )
        self.pg.send_query(command.encode())
        result = self.pg.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise self._error(result)
        self.flushed = from_lsn
        self.pg.nonblocking = 1

    def read(self, limit: int, timeout: float) -> list[tuple[int, bytes]]:
        """Up to ``limit`` pgoutput messages as ``(lsn, payload)``: what has arrived, waiting up
        to ``timeout`` for the first. Keepalives are answered here and only move :attr:`wal_end`."""
        if self._ended is not None:
            raise self._ended
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        pg = self.pg
        self._consume()  # what already arrived counts before any silence is judged
        while len(out) < limit:
            n, buf = pg.get_copy_data(1)
            if n == 0:
                left = deadline - time.monotonic()
                if out or left <= 0:
                    # Nothing new after waiting (anything already in the socket was consumed):
                    # has the server gone silent?
                    self._check_silence()
                    break
                select.select([pg.socket], [], [], min(left, STATUS_EVERY_S))
                self._consume()
                continue
            if n == -1:
                ended = self._error(pg.get_result())
                if not out:
                    raise ended
                # What came before the error (whole transactions, maybe) first; the error next time.
                self._ended = ended
                return out
            self._asked_at = None  # heard from
            kind = buf[0]
            if kind == 0x77:  # b"w": XLogData
                start = XLOG_DATA.unpack_from(buf, 1)[0]
                out.append((start, bytes(buf[25:])))
                self.received = start
            elif kind == 0x6B:  # b"k": primary keepalive
                wal_end, _, reply = KEEPALIVE.unpack_from(buf, 1)
                self.wal_end = max(self.wal_end, wal_end)
                if reply:
                    self.status()
        if time.monotonic() - self._last_status >= STATUS_EVERY_S:
            self.status(reply=True)  # the keepalive it asks for shows the connection alive
        return out

    def arrived(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` messages that have already arrived, without waiting. An error met is
        kept for the next :meth:`read`: what the caller holds from before it goes first."""
        try:
            return self.read(limit, 0.0)
        except StreamError as exc:
            self._ended = exc
            return []

    def _check_silence(self) -> None:
        asked = self._asked_at
        if asked is not None and self.silence_s > 0 and time.monotonic() - asked > self.silence_s:
            raise StreamError(
                f"connection lost: nothing from the server for {self.silence_s:g} s after asking "
                "for a keepalive (receiver_timeout_ms)",
                None,
            )

    def confirm(self, lsn: int) -> None:
        """The slot may release WAL up to ``lsn``: every sink holds what came before it durably."""
        if lsn > self.flushed:
            self.flushed = lsn
            self.status()

    def status(self, reply: bool = False) -> None:
        """Send a standby status update; ``reply`` asks for a keepalive (a fresh :attr:`wal_end`)."""
        if self._ended is not None:  # the server ended the stream: say why, not "connection lost"
            raise self._ended
        now_us = int(time.time() * 1_000_000) - PG_EPOCH_US
        written = max(self.received, self.flushed)
        msg = STATUS.pack(b"r", written, self.flushed, self.flushed, now_us, int(reply))
        try:
            self.pg.put_copy_data(msg)
            while self.pg.flush() == 1:
                select.select([], [self.pg.socket], [], 1.0)
        except Exception as exc:  # noqa: BLE001 - psycopg's OperationalError: the connection broke
            raise StreamError(f"connection lost: {exc}", None) from None
        self._last_status = time.monotonic()
        if reply and self._asked_at is None:
            self._asked_at = self._last_status

    def close(self) -> None:
        self.pg.finish()

    def _consume(self) -> None:
        try:
            self.pg.consume_input()
        except Exception as exc:  # noqa: BLE001 - psycopg's OperationalError: the connection broke
            raise StreamError(f"connection lost: {exc}", None) from None

    def _error(self, result: pq.abc.PGresult | None) -> StreamError:
        if result is None:
            return StreamError(f"connection lost: {_text(self.pg.error_message)}", None)
        state = result.error_field(pq.DiagnosticField.SQLSTATE)
        message = _text(result.error_message) or f"stream ended ({pq.ExecStatus(result.status).name})"
        return StreamError(message, state.decode() if state else None)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip()


def _connect_state(message: str) -> str | None:
    """libpq reports a refused login as text only; name the unfixable ones."""
    lowered = message.lower()
    if "password authentication failed" in lowered or "no pg_hba.conf entry" in lowered:
        return "28P01"
    if "does not exist" in lowered:  # database or role
        return "3D000"
    return None
