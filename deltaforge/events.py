"""The change event every source emits and every sink receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltaforge.position import Position

Row = dict[str, Any]

OPS = ("c", "u", "d", "r")


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where an event came from: connector, database, table and position."""

    connector: str
    db: str
    table: str
    position: Position
    ts_ms: int
    schema: str | None = None
    key: tuple[str, ...] = ()
    """The table's primary-key columns, as the source knows them (empty when it does not)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One committed row change.

    ``op`` is ``c`` (insert), ``u`` (update), ``d`` (delete) or ``r`` (snapshot read).
    ``order`` is the source position as a tuple that sorts in source order; sinks
    compare it with their checkpoint to skip what they already have.
    ``checkpoint`` is the source position *after* this event, the value a sink's
    checkpoint takes once the batch holding this event is delivered.
    ``tx_end`` marks the last event of a source transaction: batches are cut only
    there when ``respect_source_tx`` is on.
    """

    op: str
    before: Row | None
    after: Row | None
    source: SourceInfo
    tx_id: str
    tx_end: bool
    event_id: str
    order: tuple[int, ...]
    checkpoint: Position
    tenant: str = "default"
    size: int = field(default=256, compare=False)

    @property
    def idempotency_key(self) -> str:
        """``{tenant}|{db}.{table}|{tx_id}|{event_id}``: identical on every replay."""
        s = self.source
        return f"{self.tenant}|{s.db}.{s.table}|{self.tx_id}|{self.event_id}"

    @property
    def table(self) -> str:
        return self.source.table


def _slot_constructor(cls: type[Any]) -> Any:
    """A function taking every field of the frozen, slotted dataclass ``cls`` in order, and
    building it without the frozen ``__init__`` (which sets each field by name through
    ``object.__setattr__``): half the cost, for what sources build per row. Generated code, as
    ``dataclasses`` itself does; tests/test_transform_types.py checks it against the constructor."""
    names = cls.__slots__
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    ns.update({f"_set_{n}": cls.__dict__[n].__set__ for n in names})
    body = "".join(f"    _set_{n}(new, {n})\n" for n in names)
    exec(f"def build({', '.join(names)}):\n    new = _new(_cls)\n{body}    return new\n", ns)
    return ns["build"]


new_source_info: Callable[[str, str, str, Position, int, str | None, tuple[str, ...]], SourceInfo] = (
    _slot_constructor(SourceInfo)
)
"""``SourceInfo(...)``, every field given positionally, at half the cost."""

new_event: Callable[
    [str, Row | None, Row | None, SourceInfo, str, bool, str, tuple[int, ...], Position, str, int], Event
] = _slot_constructor(Event)
"""``Event(...)``, every field given positionally, at half the cost: what sources build per row."""


def with_images(e: Event, op: str, before: Row | None, after: Row | None) -> Event:
    """``e`` with another ``op`` and row images: what processors produce, 10k events at a time
    (tests/test_transform_types.py checks that it copies every field)."""
    return new_event(op, before, after, e.source, e.tx_id, e.tx_end, e.event_id, e.order, e.checkpoint,
                     e.tenant, e.size)  # fmt: skip
