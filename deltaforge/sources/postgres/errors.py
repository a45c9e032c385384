"""Which PostgreSQL failures mean "the server is down right now" (wait for it) rather than
a problem that retrying cannot fix. Used by the reader and by its decoder process."""

from __future__ import annotations

import asyncpg

from deltaforge.connectfail import host_of, why
from deltaforge.sources.base import SourceError


def is_unavailable(exc: BaseException) -> bool:
    """Refused, reset, timed out, shutting down, starting up or recovering, connection lost, at its
    connection limit or another configured limit."""
    return isinstance(
        exc,
        OSError
        | TimeoutError
        | asyncpg.PostgresConnectionError  # SQLSTATE class 08
        | asyncpg.CannotConnectNowError  # starting up, shutting down, in recovery
        | asyncpg.AdminShutdownError
        | asyncpg.CrashShutdownError
        | asyncpg.ConnectionDoesNotExistError
        | asyncpg.TooManyConnectionsError  # at max_connections: it takes one once others close
        # "all replication slots are in use" (max_replication_slots), and the server's other
        # configured limits (53400): one is freed, or the limit raised, and the source gets in
        | asyncpg.ConfigurationLimitExceededError,
    )


def describe(exc: BaseException, dsn: str | None = None) -> str:
    """``exc`` in its own words; a name that does not resolve with the DSN's host."""
    return why(exc, host_of(dsn) if dsn else None)


class DecodeFailed(SourceError):
    """pgoutput bytes that could not be decoded (the message names the LSN)."""
