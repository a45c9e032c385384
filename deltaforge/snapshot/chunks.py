"""What a source provides for snapshots: chunk reads, watermarks, and how to tell them apart."""

from __future__ import annotations

import asyncio
import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import structlog

from deltaforge.events import Event, Row, SourceInfo
from deltaforge.position import Position
from deltaforge.snapshot.window import WATERMARK_PREFIX as WATERMARK_PREFIX
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import unanswered
from supervision import Fatal

T = TypeVar("T")


async def answered(work: Awaitable[T], timeout: float, drop: Callable[[], None], who: str) -> T:
    """``work``'s answer on a connection, within ``timeout`` (``query_timeout_s``). A connection
    whose other end vanished without a reset (a host gone, a NAT that forgot it) answers nothing
    and closes nothing, and a chunk read on it held the snapshot for ever; past the timeout it
    is dropped (``drop``, without a goodbye that would wait too) and the server is unavailable;
    so is a read cancelled (a shutdown)."""
    try:
        async with asyncio.timeout(timeout):
            return await work
    except TimeoutError:
        drop()
        raise unanswered(who, timeout) from None
    except asyncio.CancelledError:
        # Left mid-query, its pool's release (shielded from the cancellation) would wait on it:
        # for ever on a connection gone silent, holding up a shutdown whose drain gave up.
        drop()
        raise


def rows_of(
    names: Sequence[str], convs: Sequence[Callable[[Any], Any] | None] | None = None
) -> Callable[[Iterable[Sequence[Any]]], list[Row]]:
    """A function making a chunk's records (sequences of column values) rows: a comprehension
    with the table's dict literal, generated for its columns (as ``dataclasses`` generates
    methods), where ``dict(zip(names, record))`` made and iterated a zip per row, four times the
    cost (docs/performance.md). Unpacking each record into one name per column raises, as
    ``zip(..., strict=True)`` did, if a record has another number of columns. A column with a
    converter (``convs[i]``) goes through it unless NULL."""
    convs = convs or [None] * len(names)
    ns: dict[str, Any] = {f"_c{i}": c for i, c in enumerate(convs) if c is not None}
    items = ", ".join(
        f"{name!r}: _{i}" if conv is None else f"{name!r}: None if _{i} is None else _c{i}(_{i})"
        for i, (name, conv) in enumerate(zip(names, convs, strict=True))
    )
    values = "".join(f"_{i}, " for i in range(len(names)))
    exec(f"def rows(records):\n    return [{{{items}}} for {values}in records]\n", ns)
    rows: Callable[[Iterable[Sequence[Any]]], list[Row]] = ns["rows"]
    return rows


plain_rows = functools.lru_cache(maxsize=256)(rows_of)
""":func:`rows_of` without converters, made once per column list (a tuple): for readers that
learn a chunk's columns from its cursor."""


class SnapshotRefused(Fatal):
    """A snapshot that cannot be taken as asked (unknown table, no primary key): say why, read nothing."""


class ChunkReader(ABC):
    """A source's side of snapshots, on connections of its own (async: no threads).

    Tables are named as the source's events name them (``db.table``, ``schema.table``);
    a chunk is the next ``limit`` rows after a key, in key order, with values as the
    source's change events carry them, so a snapshot row and a change of the same row
    look the same to sinks.
    """

    parallel = True
    """Whether chunks of several tables may share a window."""

    bounded = False
    """Whether a table's snapshot ends at its largest key when it started (:meth:`last_key`,
    :meth:`remaining`), as Debezium's incremental snapshots do. Rows that get a larger key later
    are inserted (or moved there) after that: the stream delivers them. Unbounded, a table that
    gains rows at its end faster than chunks are read was never done."""

    async def last_key(self, table: TableRef) -> list[Any] | None:
        """The largest key of ``table`` now, as :meth:`chunk` returns keys (None: it is empty)."""
        raise NotImplementedError

    async def remaining(self, table: TableRef, after: list[Any], bound: list[Any]) -> bool:
        """Whether ``table`` has rows with a key after ``after`` and not after ``bound`` (compared
        by the database, in the key's own order)."""
        raise NotImplementedError

    @abstractmethod
    async def open(self, parallel: int) -> None:
        """Connect (``parallel`` connections: chunks of that many tables are read at once)."""

    @abstractmethod
    async def close(self) -> None: ...

    async def prepare(self) -> str | None:
        """Make what snapshots need (a signal table) where possible; why not, else None. Called at
        each open: a snapshot asked for later is refused with the reason, streaming goes on."""
        return None

    @abstractmethod
    async def tables(self, names: list[str] | None) -> list[TableRef]:
        """The captured tables called ``names`` (None: all), with their primary keys; raise
        :class:`SnapshotRefused` for a table that is not there or has no primary key."""

    @abstractmethod
    async def estimate(self, table: TableRef) -> int:
        """About how many rows ``table`` has (the server's statistics; for progress only)."""

    @abstractmethod
    async def chunk(
        self, table: TableRef, after: list[Any] | None, limit: int
    ) -> tuple[list[Row], list[Any] | None, bool]:
        """Up to ``limit`` rows with a key after ``after`` (None: from the first), in key order,
        and the last one's key as it is stored in the progress (JSON)."""

    @abstractmethod
    async def watermark(self, kind: str, window: str) -> None:
        """Write the ``open`` or ``close`` watermark of ``window`` into the change stream."""

    @abstractmethod
    def name_of(self, e: Event) -> str:
        """The table of a change event, named as :meth:`tables` names it."""

    @abstractmethod
    def is_signal(self, e: Event) -> bool:
        """A watermark or signal-table event: never delivered."""

    @abstractmethod
    def mark_of(self, e: Event) -> tuple[str, str] | None:
        """``(open|close, window id)`` of a watermark event, else None."""

    @abstractmethod
    def signal_of(self, e: Event) -> list[str] | None:
        """The tables of a Debezium ``execute-snapshot`` signal row, else None."""

    @abstractmethod
    def source_info(self, table: TableRef, at: Position, ts_ms: int) -> SourceInfo:
        """What a snapshot row of ``table`` says of its origin (as the table's changes do)."""


def table_changed(source: str, table: str, columns: list[str]) -> None:
    """A chunk found ``table``'s columns changed since its queries were built: log it before they
    are built again, or refuse if the table is gone (no columns)."""
    if not columns:
        raise SnapshotRefused(f"snapshot of {table!r}: the table is gone")
    structlog.get_logger().info(
        "snapshot_table_changed", actor="snapshot", source=source, table=table, columns=columns
    )


def debezium_signal(e: Event) -> list[str] | None:
    """The tables of a Debezium signal row ``(id, type, data)`` with type ``execute-snapshot`` and
    data ``{"data-collections": [...]}`` (inserted; other kinds and malformed data are not ours)."""
    if e.op not in ("c", "r") or e.after is None or e.after.get("type") != "execute-snapshot":
        return None
    try:
        data = json.loads(str(e.after.get("data") or "{}"))
        tables = data.get("data-collections")
    except (ValueError, AttributeError):
        return None
    return [str(t) for t in tables] if isinstance(tables, list) and tables else None
