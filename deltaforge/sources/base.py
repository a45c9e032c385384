"""The protocol every source implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from deltaforge.events import Event
from deltaforge.position import Position, PositionDoc
from supervision import Fatal, Unavailable

if TYPE_CHECKING:
    from deltaforge.configmodel import SnapshotSettings
    from deltaforge.snapshot.chunks import ChunkReader

SchemaChange = tuple[str, list[dict[str, Any]], Position]
"""A table's columns as first seen: ``(table, [{name, type}, ...], position)``."""


@dataclass(frozen=True)
class ColumnsRewritten:
    """A DDL changed the values ``columns`` of ``table`` hold in existing rows, without a change
    event for any of them (a PostgreSQL enum label renamed); ``why`` says which and how."""

    table: str
    columns: tuple[str, ...]
    why: str


class SourceError(Exception):
    """A source failed in a way a restart may fix (see SourceUnavailable for a server that is down)."""


P = TypeVar("P")


def own_position(position: Position | None, kind: type[P]) -> P | None:
    """``position`` as a source's own type: the pipeline hands a source only positions that
    source made or loaded, so anything else is a wiring bug, not a user error."""
    if position is None or isinstance(position, kind):
        return position
    raise TypeError(f"expected a {kind.__name__}, got {type(position).__name__}")


class SourceMisconfigured(Fatal):
    """The server is not set up for CDC; a restart cannot fix it."""


class SourceUnavailable(SourceError, Unavailable):
    """The source's server cannot be reached right now (refused, reset, shutting down,
    timed out): wait for it, with backoff, for as long as it takes."""


def unanswered(who: str, timeout: float) -> SourceUnavailable:
    """What a connection given up for its silence says: its server's host vanished, or a NAT
    forgot it, and nothing answers or closes it (``query_timeout_s``)."""
    return SourceUnavailable(
        f"{who}: no answer for {timeout:g} s (query_timeout_s): the connection is given up"
    )


class PositionLost(Fatal):
    """The checkpointed position is gone from the source: never skip, halt."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"position lost: {reason}. Re-snapshot required.")


class Undeterminable(Exception):
    """Whether a position is still reachable could not be told (a query failed): warn, continue."""


@dataclass(frozen=True, slots=True)
class DeclaredTable:
    """A captured table's columns as the database declares them: ``(name, SQL type)`` in order."""

    db: str
    table: str
    columns: tuple[tuple[str, str], ...]


class Source(ABC):
    """A reader of committed changes, resumed from a checkpoint.

    ``read()`` returns the next chunk of events in source order (empty when the
    source is idle; the caller waits before asking again). Every event ends a
    chunk only at a transaction boundary unless the source cannot tell.
    Blocking client libraries must run in worker threads, never on the loop.
    """

    id: str
    connector: str
    generation: int = 0
    """How many failovers to another server reading has gone through (the FailoverReconciler
    sets it before each ``open``). A source whose positions are server-local, like binlog
    coordinates, puts it first in its order; one with global positions (LSNs) ignores it."""
    resets: int = 0
    """How many times the position was lost and reading began again from now (``snapshot.mode:
    when_needed``; the SnapshotDriver sets it before each ``open``). The coordinates may then go
    back (a binlog reset, a database restored from an older copy, Turso's change ids started
    again), and a sink skips what sorts at or before what it holds: each source leads its
    positions' order with the count (``position.after_resets``), so everything read after a reset
    sorts after everything before it."""
    from_now: bool = False
    """With no checkpoint, start at the newest change instead of the oldest kept: a snapshot is about
    to copy the tables (set by the SnapshotDriver before ``open``)."""
    start_from: Position | None = None
    """With ``from_now``: where an earlier opening without a checkpoint started, to start there
    again (None: from now). A restart before the first checkpoint was durable must not take a
    newer "now": it would skip what the restart dropped undelivered, such as a delete of a row
    the first snapshot had already delivered. A source that reads from now sets it when it opens;
    the SnapshotDriver stores it with the snapshot's progress, for the next process."""
    dead_letters: Callable[[Event, str], Awaitable[object]] | None = None
    """Where a record the source cannot read goes (the dead-letter queue, set by the runner when
    ``spec.journal.enabled``), with why; None: such a record halts the pipeline."""
    native_envelopes: bool = False
    """Whether a Kafka sink sends the ``native`` envelope: the MySQL/MariaDB source then has its
    decoder child make each change's envelope, record key and idempotency key too (``Event.made``;
    set by the runner).
    docs/performance.md says why only for Kafka, and why not PostgreSQL's child."""
    scope: str = ""
    """Who runs this source: the machine, the checkpoint store and the pipeline (set by the
    runner). What the source calls itself on the server is derived from it, so that no other
    pipeline's source shares it: a MySQL/MariaDB replica server id (two replicas of one id drop
    each other, endlessly)."""
    on_schema_drift: str = "adapt"
    """After a failover, when the new server's tables differ from the recorded schemas: adapt or halt."""

    @property
    def retained_bytes(self) -> int | None:
        """How much of its log the server keeps for this source, as last looked at (PostgreSQL: the
        WAL its replication slot holds); None: not known, or nothing the source holds back."""
        return None

    remembered: dict[str, Any] | None = None
    """What :meth:`memo` returned after the last opening, in this process or an earlier one:
    the SourceReader stores it beside the checkpoints and sets it before each ``open``."""

    def memo(self) -> dict[str, Any] | None:
        """What to remember of this opening for the next one (None: nothing), for what can change
        while no pipeline reads, such as a PostgreSQL publication's tables."""
        return None

    @abstractmethod
    async def open(self, resume_after: Position | None) -> None:
        """Connect and position after ``resume_after`` (None: from the beginning)."""

    @abstractmethod
    async def read(self) -> list[Event]:
        """The next chunk of events; ``[]`` when nothing new is committed."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Disconnect."""

    async def forget(self) -> None:  # noqa: B027 - optional hook
        """The pipeline was deleted with its checkpoints: let go of what the server keeps for this
        source and nothing will read again (a PostgreSQL slot keeps WAL for ever). Never raises:
        what cannot be let go of is said, with what to run."""

    async def identity(self) -> dict[str, str] | None:
        """Which server is behind the DSN now (stable fields such as a server UUID), for the
        FailoverReconciler; None for a source without one (an embedded file)."""
        return None

    async def reconcile(self, checkpoint: Position, previous: dict[str, str] | None) -> None:  # noqa: B027
        """Before ``open``: raise :class:`PositionLost` when reading cannot resume after
        ``checkpoint`` on this server, :class:`Undeterminable` when that cannot be told.
        ``previous`` is the identity of the server the checkpoint came from when another one is
        behind the DSN now (a failover): then also prepare ``open`` to resume there safely."""

    async def confirm(self, checkpoint: Position) -> None:  # noqa: B027 - optional hook
        """Every sink holds ``checkpoint`` durably; a source may release what lies before it."""

    async def filled(self, table: str, columns: list[str]) -> list[str]:
        """Of ``columns``, just added to ``table``, those its existing rows hold a value in (a
        default, NOT NULL, generated): where the ADD COLUMN changed rows without a change event.
        A source that cannot tell returns them all."""
        return columns

    def take_schema_changes(self) -> list[SchemaChange]:
        """Schemas first seen since the last call: ``(table, columns, position)``."""
        return []

    def take_rewritten(self) -> list[ColumnsRewritten]:
        """Columns a DDL changed in existing rows without a change event, found since the last
        call and not told by a schema change (a type whose values were renamed). Once taken,
        :meth:`memo` notes them as told."""
        return []

    async def describe_tables(self) -> list[DeclaredTable]:
        """The captured tables that exist now, with their declared column types.

        Used to type row images for processors and to check processors at start; a
        source that cannot tell returns ``[]`` and row images are typed from values.
        It opens its own short connection: it may run before ``open``.
        """
        return []

    def chunk_reader(self, settings: SnapshotSettings) -> ChunkReader | None:
        """This source's side of snapshots (None: it cannot take them)."""
        return None

    @staticmethod
    @abstractmethod
    def load_position(doc: PositionDoc) -> Position:
        """A stored checkpoint as this source's position type."""

    @property
    def idle_wait(self) -> float:
        """Seconds to wait after an empty read."""
        return 0.05

    @property
    def starts_at_oldest(self) -> bool:
        """Opened without a checkpoint, the source reads every change it still keeps (MySQL's
        oldest binlog, Turso's CDC table, PostgreSQL's slot), not from now: a sink without a
        checkpoint beside sinks with one may be given that start (see ``resume_point``)."""
        return True

    def caught_up(self) -> bool:
        """After a read: whether nothing more is ready to read right now.

        The Accumulator hands a partial batch on at once when the source is caught up, and lets
        it grow (up to ``max_events``, ``max_bytes``, ``max_ms``) only while more is waiting: low
        latency under light load, big batches through a backlog. A source that cannot tell says
        True (latency first)."""
        return True
