"""What a snapshot has done, saved beside the checkpoints so a restart resumes it.

A chunk is done only once every sink holds it: its rows are emitted at positions just
after the high watermark, and its progress becomes a *mark* at the position of the event
that closes the window. On (re)start the newest mark at or before the checkpoint every sink
holds says where to go on; marks past it are chunks that were not delivered everywhere,
read again (duplicates at worst, never a gap). The *base* is the state a snapshot started
in (or the newest durable mark, once the checkpoints pass one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from deltaforge.position import JsonValue, PositionDoc
from deltaforge.state.checkpoints import CheckpointStore

if TYPE_CHECKING:
    from deltaforge.pipeline.storewait import PatientWrites


@dataclass
class SnapshotState:
    """A snapshot in progress: tables still to read, in order, and where each stands."""

    id: str
    kind: str
    """``initial`` (Debezium ``source.snapshot: true``) or ``incremental`` (on request)."""
    pending: list[str]
    cursors: dict[str, list[Any] | None] = field(default_factory=dict)
    """Each started table's last key read (the next chunk starts after it)."""
    rows: dict[str, int] = field(default_factory=dict)
    estimates: dict[str, int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)

    @property
    def done(self) -> bool:
        return not self.pending

    def to_doc(self) -> dict[str, JsonValue]:
        return {
            "id": self.id,
            "kind": self.kind,
            "pending": list(self.pending),
            "cursors": cast(dict[str, JsonValue], dict(self.cursors)),
            "rows": dict(self.rows),
            "estimates": dict(self.estimates),
            "started_at": self.started_at,
        }

    @classmethod
    def from_doc(cls, doc: Any) -> SnapshotState:
        return cls(
            str(doc["id"]),
            str(doc["kind"]),
            [str(t) for t in doc["pending"]],
            {str(k): (list(v) if v is not None else None) for k, v in doc.get("cursors", {}).items()},
            {str(k): int(v) for k, v in doc.get("rows", {}).items()},
            {str(k): int(v) for k, v in doc.get("estimates", {}).items()},
            float(doc.get("started_at", time.time())),
        )

    def copy(self) -> SnapshotState:
        return SnapshotState.from_doc(self.to_doc())


def progress_key(source_id: str) -> str:
    return f"{source_id}::snapshot"


class ProgressLog:
    """The stored base and marks of one source's snapshot (one record in the checkpoint store)."""

    def __init__(self, store: CheckpointStore, source_id: str, patient: PatientWrites) -> None:
        self.store = store
        self.patient = patient  # a full disk is waited out (storewait)
        self.key = progress_key(source_id)
        self.base: SnapshotState | None = None
        self.marks: list[tuple[tuple[int, ...], SnapshotState]] = []
        self.stream_from: PositionDoc | None = None
        """Where the stream started when the snapshot began with no checkpoint (the source's
        ``start_from``): saved before any of its rows is delivered, so a process that dies
        before the first checkpoint starts the stream there again, not from a newer now."""

    async def load(self, durable: tuple[int, ...] | None) -> SnapshotState | None:
        """The state to go on from, given the order every sink holds (None: no sink checkpoint)."""
        doc = await self.store.get(self.key)
        self.marks = []
        self.base = SnapshotState.from_doc(doc["base"]) if doc and doc.get("base") else None
        if doc is None or self.base is None:
            self.stream_from = None
            return None
        self.stream_from = cast(PositionDoc | None, doc.get("stream_from"))
        for order, state in cast(list[list[Any]], doc.get("marks", [])):
            if durable is not None and tuple(order) <= durable:
                self.base = SnapshotState.from_doc(state)  # delivered everywhere
        await self._save()  # marks past the checkpoint are chunks to read again
        return self.base.copy()

    async def stream_start(self) -> PositionDoc | None:
        """The stored ``stream_from`` of a snapshot still in progress (None: none stored)."""
        doc = await self.store.get(self.key)
        if doc is None or not doc.get("base"):
            return None
        return cast(PositionDoc | None, doc.get("stream_from"))

    async def begin(self, state: SnapshotState, stream_from: PositionDoc | None = None) -> None:
        self.base, self.marks, self.stream_from = state.copy(), [], stream_from
        await self._save()

    async def mark(self, order: tuple[int, ...], state: SnapshotState) -> None:
        self.marks.append((order, state.copy()))
        await self._save()

    async def extend(self, names: list[str], estimates: dict[str, int]) -> None:
        """Tables asked for while a snapshot runs join it, in every stored state: a restart from
        any of them still reads them."""
        for state in [s for s in (self.base,) if s is not None] + [s for _, s in self.marks]:
            for name in names:
                if name not in state.pending:
                    state.pending.append(name)
                    state.cursors.pop(name, None)
                    state.rows[name] = 0
                    state.estimates[name] = estimates.get(name, 0)
        await self._save()

    async def confirm(self, durable: tuple[int, ...]) -> None:
        """Every sink holds ``durable``: marks at or before it become the base."""
        kept = [(o, s) for o, s in self.marks if o > durable]
        if len(kept) == len(self.marks):
            return
        self.base = next(s for o, s in reversed(self.marks) if o <= durable)
        self.marks = kept
        if self.base.done and not kept:
            self.base = self.stream_from = None  # finished, everywhere
        await self._save()

    async def clear(self) -> None:
        self.base, self.marks, self.stream_from = None, [], None
        await self._save()

    async def _save(self) -> None:
        doc: PositionDoc = {
            "base": self.base.to_doc() if self.base else None,
            "marks": [[list(o), s.to_doc()] for o, s in self.marks],
            "stream_from": self.stream_from,
        }
        await self.patient(lambda: self.store.put(self.key, doc))
