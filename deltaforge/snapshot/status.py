"""What the API, metrics and the terminal show of snapshots (written by the SourceReader only)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deltaforge.snapshot.progress import SnapshotState


@dataclass
class TableProgress:
    rows: int = 0
    estimate: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    rows_this_run: int = 0
    """Rows read since this process took the table up (the rate is of these)."""

    def to_dict(self, now: float) -> dict[str, Any]:
        end = self.finished_at or now
        rate = (
            self.rows_this_run / (end - self.started_at) if self.started_at and end > self.started_at else 0.0
        )
        left = max(self.estimate - self.rows, 0)
        return {
            "rows": self.rows,
            "estimate": max(self.estimate, self.rows),
            "done": self.finished_at is not None,
            "rows_per_s": round(rate, 1),
            "eta_s": round(left / rate, 1) if rate and self.finished_at is None else None,
        }


@dataclass
class SnapshotStatus:
    """The running snapshot (if any) and the last ones finished in this process."""

    id: str | None = None
    kind: str | None = None
    tables: dict[str, TableProgress] = field(default_factory=dict)
    finished: list[dict[str, Any]] = field(default_factory=list)
    rows_total: int = 0
    """Snapshot rows emitted by this process, all snapshots together (a counter for metrics)."""
    started_at_start: bool = False
    """``mode: always`` took its snapshot in this process (a reconnect is not a start)."""

    @property
    def running(self) -> bool:
        return self.id is not None

    def follow(self, state: SnapshotState) -> None:
        """Show ``state`` (a snapshot started or resumed)."""
        if self.id != state.id:
            self.id, self.kind, self.tables = state.id, state.kind, {}
        for name in [*state.rows, *state.pending]:
            t = self.tables.setdefault(name, TableProgress())
            t.rows = state.rows.get(name, 0)
            t.estimate = state.estimates.get(name, 0)
            if name not in state.pending and t.finished_at is None:
                t.finished_at = time.time()

    def end(self, state: SnapshotState) -> None:
        self.follow(state)
        self.finished = [*self.finished[-4:], self.to_dict()["current"] or {}]
        self.id = self.kind = None
        self.tables = {}

    def to_dict(self) -> dict[str, Any]:
        now = time.time()
        current = (
            {"id": self.id, "kind": self.kind, "tables": {k: v.to_dict(now) for k, v in self.tables.items()}}
            if self.running
            else None
        )
        return {"running": self.running, "current": current, "finished": list(self.finished)}
