"""Positions: where a source stands, as a type per source rather than a dict.

Each source declares its own position type (``BinlogPosition``, ``PgPosition``,
``TursoPosition``): a frozen ``NamedTuple`` with the ordering and the stored form in
one place. A NamedTuple because every event carries one and building it costs what a
dict costs (a frozen dataclass costs five times as much, measured on the MySQL path).

Positions are compared only through :attr:`Position.order`, a tuple of integers that
sorts in source order. The stored form (:meth:`Position.to_doc`) is the small JSON
mapping checkpoints have always held, so a store written by earlier versions still
reads back (``from_doc`` fills fields older versions did not write).

    >>> from deltaforge.sources.turso.position import TursoPosition
    >>> a, b = TursoPosition(7), TursoPosition.from_doc({"change_id": 9})
    >>> a.order < b.order, b.to_doc()
    (True, {'change_id': 9})
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache, reduce
from itertools import chain
from typing import Any, Protocol, TypeAlias, TypeVar, Union, cast

JsonValue: TypeAlias = Union[str, int, float, bool, list["JsonValue"], dict[str, "JsonValue"], None]  # noqa: UP007
PositionDoc: TypeAlias = dict[str, JsonValue]
"""A position as stored: a JSON mapping (what the checkpoint store and the CLI see)."""


class Position(Protocol):
    """What the pipeline needs from any source's position type."""

    @property
    def order(self) -> tuple[int, ...]:
        """Sorts in source order: a sink at ``a`` has every change at or before ``a``."""
        ...

    def to_doc(self) -> PositionDoc:
        """The stored form."""
        ...


class _Ordered(Protocol):
    @property
    def order(self) -> tuple[int, ...]: ...

    @property
    def checkpoint(self) -> Position: ...


E = TypeVar("E", bound=_Ordered)


RESET_BASE = 1 << 62
"""Leads the order of a position read after ``resets`` lost positions (see :func:`after_resets`):
above any coordinate a source has (an LSN of 2**62 is four exabytes of WAL), and inside the
64-bit integers that JSON, SQLite and orjson keep (stored snapshot progress holds orders)."""


def after_resets(resets: int, order: tuple[int, ...]) -> tuple[int, ...]:
    """``order`` of a position read after ``resets`` lost positions (``Source.resets``): led by
    ``RESET_BASE + resets``, above any coordinate, so it sorts after every position of an earlier
    reset, whatever its coordinates. Without a reset the order is the coordinates' own, as stored
    before resets were counted. As text (``position_text``, 16 hex digits a part) the lead starts
    with 4 where a coordinate starts with 0, so it sorts after them there too."""
    return (RESET_BASE + resets, *order) if resets else order


def position_text(order: tuple[int, ...]) -> str:
    """A source position as text that sorts like the tuple (fixed-width hex per part)."""
    return ".".join(f"{p:016x}" for p in order)


def as_int(doc: PositionDoc, key: str, default: int = 0) -> int:
    """An integer field of a stored position (``default`` when an older version left it out)."""
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"checkpoint field {key!r} is not an integer: {value!r}")
    return int(value)


def as_str(doc: PositionDoc, key: str, default: str = "") -> str:
    """A text field of a stored position (``default`` when missing or null)."""
    value = doc.get(key, default)
    return default if value is None else str(value)


class PartitionedPosition(Position, Protocol):
    """A position over independent partitions (a Kafka consumer's offsets): no total order.

    Two sinks' positions may each be ahead on another partition, and a resume replays the
    partitions interleaved differently from the first time, so "has this sink got that event"
    is asked of the partition the event came from, not of ``order``. Positions of one reading
    still grow partition by partition, so ``order`` sorts them as long as no resume lies between.
    """

    def join(self, other: Any) -> Any:
        """Every partition at the further of the two: what a sink holds after getting ``other``."""
        ...

    def meet(self, other: Any) -> Any:
        """Every partition at the nearer of the two (absent where either lacks it): what both hold."""
        ...

    def holds(self, checkpoint: Any) -> bool:
        """Whether a sink at this position has the event whose checkpoint is ``checkpoint``."""
        ...

    def lane(self) -> tuple[str, tuple[int, ...]] | None:
        """The partition this position is right after a record of, named, and that record's order
        within it (None for a position loaded from a checkpoint). A sink that keeps a watermark
        of what it wrote (Redis ``exactly_once``) keeps one per partition: records of different
        partitions do not sort against each other."""
        ...


def lane_of(position: Position) -> tuple[str, tuple[int, ...]] | None:
    """:meth:`PartitionedPosition.lane` of a partitioned position; None for any other."""
    if _partitioned(type(position)):
        return cast(PartitionedPosition, position).lane()
    return None


@cache
def _partitioned(kind: type) -> bool:
    """Whether positions of ``kind`` are :class:`PartitionedPosition`s: once per type, because an
    isinstance check against a runtime protocol costs ~13 µs, and this runs for every batch."""
    return all(callable(getattr(kind, name, None)) for name in ("join", "meet", "holds", "lane"))


def advance(current: Position | None, reached: Position) -> Position:
    """Where a sink at ``current`` stands once it also holds everything up to ``reached``."""
    if current is None:
        return reached
    if _partitioned(type(current)):
        return cast(PartitionedPosition, current).join(reached)  # type: ignore[no-any-return]
    return reached if reached.order > current.order else current


def earliest(positions: Iterable[Position]) -> Position:
    """What every one of ``positions`` holds: where reading resumes for all of them."""
    it = iter(positions)
    first = next(it)
    if _partitioned(type(first)):
        return reduce(lambda a, b: a.meet(b), it, cast(PartitionedPosition, first))
    return min(chain((first,), it), key=lambda p: p.order)


def not_held(position: Position | None, events: list[E]) -> list[E]:
    """The events a sink at ``position`` does not have yet (a replay after a resume sends some again)."""
    if position is None or not events:
        return events
    if _partitioned(type(position)):
        holds = cast(PartitionedPosition, position).holds
        return [e for e in events if not holds(e.checkpoint)]
    done = position.order
    if events[0].order > done:
        return events
    return [e for e in events if e.order > done]
