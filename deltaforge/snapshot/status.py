"""What the API, metrics and the terminal show of snapshots (written by the SourceReader only)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deltaforge.configmodel import SnapshotSettings
from deltaforge.snapshot.progress import SnapshotState

_WARN_S: float = SnapshotSettings().stream_lag_warning_s
"""The setting's default, until a driver sets the pipeline's own."""


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
        left = self.estimate - self.rows
        return {
            "rows": self.rows,
            "estimate": max(self.estimate, self.rows),
            "done": self.finished_at is not None,
            "rows_per_s": round(rate, 1),
            # Past the server's estimate (a table that grew, or none was made): how long is unknown.
            "eta_s": round(left / rate, 1) if rate and left > 0 and self.finished_at is None else None,
        }


@dataclass
class WindowWaits:
    """How long each window waited for its high watermark to come back through the stream: the
    stream's lag behind the database. A wait over ``warn_s`` says the stream reads behind what
    the database writes, and a snapshot goes only as fast as its windows close; it is said once,
    then again each time the wait doubles, and once more when a wait is back under ``warn_s``.

        >>> waits = WindowWaits(warn_s=10.0)
        >>> [waits.seen(s) for s in (0.2, 12.0, 15.0, 25.0, 0.3)]
        [None, 'behind', None, 'behind', 'caught_up']
    """

    warn_s: float
    last_s: float | None = None
    max_s: float = 0.0
    said_s: float = 0.0
    """The wait last said to be behind (0: none is, since the snapshot began or caught up)."""

    def seen(self, waited_s: float) -> str | None:
        """Take a window's wait; what to say of it, if anything: ``behind`` or ``caught_up``."""
        self.last_s, self.max_s = waited_s, max(self.max_s, waited_s)
        if waited_s > self.warn_s and waited_s >= 2 * self.said_s:
            self.said_s = waited_s
            return "behind"
        if waited_s <= self.warn_s and self.said_s:
            self.said_s = 0.0
            return "caught_up"
        return None

    def to_dict(self) -> dict[str, Any]:
        last = None if self.last_s is None else round(self.last_s * 1000, 1)
        return {"window_wait_ms": last, "window_wait_max_ms": round(self.max_s * 1000, 1)}


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
    waits: WindowWaits = field(default_factory=lambda: WindowWaits(warn_s=_WARN_S))
    """The running snapshot's windows' waits (the driver sets ``warn_s`` from the settings)."""

    @property
    def running(self) -> bool:
        return self.id is not None

    def follow(self, state: SnapshotState) -> None:
        """Show ``state`` (a snapshot started or resumed)."""
        if self.id != state.id:
            self.id, self.kind, self.tables = state.id, state.kind, {}
            self.waits = WindowWaits(warn_s=self.waits.warn_s)
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
            {
                "id": self.id,
                "kind": self.kind,
                "tables": {k: v.to_dict(now) for k, v in self.tables.items()},
                **self.waits.to_dict(),
            }
            if self.running
            else None
        )
        return {"running": self.running, "current": current, "finished": list(self.finished)}
