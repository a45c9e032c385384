"""The PostgreSQL source's own connections (not the stream's, which its decoder process opens):
each question on them answered within ``query_timeout_s`` or the connection given up.

asyncpg has no keepalive and no statement timeout unless given one: a connection whose other end
went silent for good (the server's host vanished, a NAT forgot it) answered nothing and closed
nothing, and whatever asked on it waited for ever. Each question is bounded by ``query_timeout_s``,
but for the few that may rightly take hours (``slot.DECODING_S``); those are ended by TCP
keepalive (``tcpkeepalive.py``) when the server's host stops answering, and by a watch from
another connection (``watched.py``) when the server is paused or the connection silent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from deltaforge.sources.base import SourceUnavailable, unanswered
from deltaforge.sources.postgres.errors import describe, is_unavailable
from deltaforge.sources.postgres.values import OWN_BOUNDS
from deltaforge.tcpkeepalive import keep_asyncpg_alive

CONNECT_S = 10.0


async def connect(dsn: str, query_timeout: float, who: str) -> asyncpg.Connection:
    """A connection whose questions time out after ``query_timeout`` (asyncpg's
    ``command_timeout``: past it a question raises :class:`TimeoutError`), reached within
    :data:`CONNECT_S`, or the server is unavailable."""
    try:
        conn = await asyncpg.connect(
            dsn, timeout=CONNECT_S, command_timeout=query_timeout, server_settings=OWN_BOUNDS
        )
    except TimeoutError:
        raise SourceUnavailable(f"{who}: no connection within {CONNECT_S:g} s") from None
    keep_asyncpg_alive(conn)
    return conn


@contextlib.asynccontextmanager
async def short(dsn: str, query_timeout: float, who: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection for a few questions; a server that goes down, while connecting or while
    asked, is unavailable, not an error; so is one that answers nothing for ``query_timeout``."""
    try:
        conn = await connect(dsn, query_timeout, who)
        try:
            yield conn
        except TimeoutError:
            raise unanswered(who, query_timeout) from None
        finally:
            conn.terminate()  # only questions were asked on it: nothing to flush, and it may be broken
    except Exception as exc:
        if is_unavailable(exc):
            raise SourceUnavailable(f"{who}: {describe(exc, dsn)}") from None
        raise
