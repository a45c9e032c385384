"""The change event every source emits and every sink receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]

OPS = ("c", "u", "d", "r")


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where an event came from: connector, database, table and position."""

    connector: str
    db: str
    table: str
    position: dict[str, Any]
    ts_ms: int
    schema: str | None = None


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
    checkpoint: dict[str, Any]
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
