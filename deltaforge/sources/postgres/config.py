"""``spec.source.config`` of a PostgreSQL source."""

from __future__ import annotations

from pydantic import Field

from deltaforge.configmodel import (
    Bool,
    Identifier,
    NonNegativeInt,
    PositiveInt,
    PostgresDsn,
    ServerSourceSettings,
    TableNames,
)

SILENCE_IF_NEVER_S = 60.0
"""Where a bound is needed on silence and ``receiver_timeout_ms`` is 0 (never): how long the
decoder's catalog connection may idle or leave a question unanswered, and (with the slack of
``childproc``) how long the decoder process may say nothing before it is taken for stopped."""


class PostgresSourceConfig(ServerSourceSettings):
    """A logical replication slot (pgoutput) on a server with ``wal_level=logical``."""

    dsn: PostgresDsn = Field(description="postgresql://user:password@host:port/db (${VAR} for the password).")
    slot: Identifier = Field("deltaforge", description="The replication slot (created when missing).")
    publication: Identifier = Field("deltaforge", description="The publication (created when missing).")
    tables: TableNames = Field(
        default_factory=list, description="schema.table names to publish (default: all)."
    )
    create: Bool = Field(True, description="Create the slot and publication when missing.")
    read_chunk: PositiveInt = Field(5000, description="Most pgoutput messages decoded per read.")
    heartbeat_ms: PositiveInt = Field(
        10_000, description="While idle, move checkpoints and the slot this often."
    )
    poll_interval_ms: PositiveInt = Field(100, description="Wait after a read that found nothing new.")
    receiver_timeout_ms: NonNegativeInt = Field(
        60_000,
        description="A stream that answers nothing this long, not even a keepalive it asked for, has "
        "lost its connection (PostgreSQL's own wal_receiver_timeout rule): a network that drops "
        "packets without closing is noticed. 0: never.",
    )
    wal_warn_mb: PositiveInt = Field(
        1024,
        description="Warn when the slot keeps more WAL than this on the server (a sink behind holds it "
        "there), and again at each doubling.",
    )

    @property
    def silence_bound_s(self) -> float:
        """``receiver_timeout_ms`` in seconds, or :data:`SILENCE_IF_NEVER_S` where it is 0."""
        return self.receiver_timeout_ms / 1000 or SILENCE_IF_NEVER_S
