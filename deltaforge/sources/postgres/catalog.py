"""The decoder process's catalog connection: what the stream does not say of a table (its
primary key, its columns' types, who holds the slot), asked of the server as it is needed."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any

from deltaforge.sources.postgres.replication import StreamError


class Catalog:
    """The child's catalog connection (primary keys, column types; ``deltaforge decoder`` in
    ``pg_stat_activity``). It idles between tables' first changes, and a server closes idle
    sessions (``idle_session_timeout``, a DBA's clean-up): a query on a connection found closed
    is asked again once on a new one, where it failed the stream as a source error. A NAT or
    firewall forgets an idle connection without a word, and a question asked on it waited for
    ever, the stream unread: one idle longer than ``idle_s`` (the stream's own silence bound) is
    opened anew before it is asked. One that goes silent mid-question (its host vanished, a NAT
    forgot it while busy) is cut after ``idle_s`` too: psycopg's blocking wait has no timeout of
    its own, and the stream is read in this same thread."""

    def __init__(self, dsn: str, idle_s: float = 60.0) -> None:
        self.dsn = dsn
        self.idle_s = idle_s
        self.conn = self._connect()
        self.used_at = time.monotonic()

    def _connect(self) -> Any:
        import psycopg

        try:
            return psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=10, application_name="deltaforge decoder"
            )
        except psycopg.OperationalError as exc:
            raise StreamError(f"cannot connect: {exc}", exc.sqlstate) from None

    def rows(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if time.monotonic() - self.used_at > self.idle_s:
            self.conn.close()
            self.conn = self._connect()
        self.used_at = time.monotonic()
        try:
            return self._asked(query, params)
        except Exception:
            if not self.conn.closed:  # an answer from the server: its error stands
                raise
        self.conn = self._connect()
        return self._asked(query, params)

    def _asked(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """The query's rows; past ``idle_s`` unanswered the connection's socket is shut down,
        which ends the wait as a connection closed (the caller asks again on a new one)."""
        conn = self.conn
        timer = threading.Timer(self.idle_s, _cut, (conn.fileno(),))
        timer.daemon = True
        timer.start()
        try:
            return list(conn.execute(query, params).fetchall())
        finally:
            timer.cancel()


def _cut(fd: int) -> None:
    """Shut the socket ``fd`` down both ways, as a reset would (a copy of it: the connection
    closes its own)."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)
