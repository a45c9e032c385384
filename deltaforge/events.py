"""The change event every source emits and every sink receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from deltaforge.position import Position
from deltaforge.slots import slot_constructor

Row = dict[str, Any]


def not_carried(v: Any) -> bool:
    """Whether ``v`` is a source's marker for a value its change does not carry, not a value: the
    PostgreSQL source's for a TOASTed value an update did not send (``{"__unchanged_toast__":
    true}``, Debezium's placeholder read back too), the MySQL and PostgreSQL sources' for one a
    partial row image or a key-only old row left out (``{"__not_logged__": true}``)."""
    return (
        type(v) is dict
        and len(v) == 1
        and (v.get("__unchanged_toast__") is True or v.get("__not_logged__") is True)
    )


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


Made = tuple[bytes, bytes | str | None, bytes]
"""A change's Kafka record parts made by a decoder child: its ``native`` envelope as JSON (what
the ``native`` encoder returns for it), its default record key (:func:`deltaforge.envelopes.row_key`)
and its idempotency key as bytes (a record header). A plain tuple: it is unpickled per change."""


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
    made: Made | None = field(default=None, compare=False, repr=False)
    """This change's Kafka record as far as it was made where it was decoded (the MySQL decoder
    child, in a process of its own, so that ``serve``'s GIL does not pay for it): see
    :data:`Made`. None where not made, and on every event derived from another
    (:data:`with_images`, a sink's split of a key move), whose record differs."""

    @property
    def idempotency_key(self) -> str:
        """``{tenant}|{db}.{table}|{tx_id}|{event_id}``: identical on every replay."""
        s = self.source
        return f"{self.tenant}|{s.db}.{s.table}|{self.tx_id}|{self.event_id}"

    @property
    def table(self) -> str:
        return self.source.table


new_source_info: Callable[[str, str, str, Position, int, str | None, tuple[str, ...]], SourceInfo] = (
    slot_constructor(SourceInfo)
)
"""``SourceInfo(...)``, every field given positionally, without a call per field."""


class _NewEvent(Protocol):
    def __call__(
        self,
        op: str,
        before: Row | None,
        after: Row | None,
        source: SourceInfo,
        tx_id: str,
        tx_end: bool,
        event_id: str,
        order: tuple[int, ...],
        checkpoint: Position,
        tenant: str,
        size: int,
        made: Made | None = None,
        /,
    ) -> Event: ...


new_event: _NewEvent = slot_constructor(Event, reset=("made",))
"""``Event(...)``, every field given positionally (``made`` may be left out), without a call per
field: what sources build per row."""


with_images: Callable[[Event, str, Row | None, Row | None], Event] = slot_constructor(
    Event, ("op", "before", "after"), reset=("made",)
)
"""``with_images(e, op, before, after)``: ``e`` with another ``op`` and row images, what
processors produce, 10k events at a time (tests/test_transform_types.py checks that it copies
every field but ``made``, which it leaves None: the record of the images it had)."""
