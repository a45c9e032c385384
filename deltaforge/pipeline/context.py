"""What the actors of one pipeline share: config, store, plug-ins, clock, counters.

Actors do not find each other here: each gets the refs it talks to as typed
constructor arguments (see ``tree.py``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltaforge.config import PipelineConfig
from deltaforge.pipeline.availability import Availability
from deltaforge.position import Position, earliest
from deltaforge.sinks.base import Sink
from deltaforge.snapshot.status import SnapshotStatus
from deltaforge.sources.base import Source
from deltaforge.state.checkpoints import CheckpointStore, sink_key
from supervision import Clock, MonotonicClock

if TYPE_CHECKING:
    from deltaforge.pipeline.dlq import DeadLetterQueue


@dataclass
class SinkStats:
    """Per-sink counters for the API."""

    events: int = 0
    bytes: int = 0
    batches: int = 0
    txn_commits: int = 0
    txn_aborts: int = 0
    skipped: int = 0
    errors: int = 0
    retries: int = 0
    dead_letters: int = 0
    """Poison events this sink sent to the DLQ."""
    lost_acknowledged: int = 0
    """Times the sink's server was found without entries it had acknowledged (``acknowledged.py``)."""
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    """``retryable`` / ``non_retryable`` failed attempts (the metrics' ``kind`` label)."""
    checkpoint_at: float | None = None
    """When this sink's checkpoint was last written in this run (wall clock)."""
    lagging: bool = False
    last_error: str | None = None


@dataclass
class PipelineStats:
    """Counters the REST API shows; written only by the pipeline's own actors."""

    events_read: int = 0
    bytes_read: int = 0
    source_errors: int = 0
    batches_committed: int = 0
    events_committed: int = 0
    commit_failures: int = 0
    transform_batches: int = 0
    transform_jobs: int = 0
    transform_events_in: int = 0
    transform_events_out: int = 0
    transform_failures: int = 0
    transform_last_ms: float | None = None
    transform_most_inflight: int = 0
    spark_session_starts: int = 0
    last_checkpoint: Position | None = None
    last_commit_at: float | None = None
    started_at: float = field(default_factory=time.time)
    sinks: dict[str, SinkStats] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "events_read": self.events_read,
            "bytes_read": self.bytes_read,
            "source_errors": self.source_errors,
            "batches_committed": self.batches_committed,
            "events_committed": self.events_committed,
            "commit_failures": self.commit_failures,
            "transform": {
                "batches": self.transform_batches,
                "jobs": self.transform_jobs,
                "events_in": self.transform_events_in,
                "events_out": self.transform_events_out,
                "failures": self.transform_failures,
                "last_ms": self.transform_last_ms,
                "most_inflight": self.transform_most_inflight,
                "spark_session_starts": self.spark_session_starts,
            },
            "last_checkpoint": self.last_checkpoint.to_doc() if self.last_checkpoint else None,
            "last_commit_at": self.last_commit_at,
            "uptime_s": round(time.time() - self.started_at, 3),
            "sinks": {k: vars(v) for k, v in self.sinks.items()},
        }


@dataclass
class PipelineContext:
    """Built once per pipeline and read by its actors.

    ``clock`` and ``rng`` are the pipeline's only sources of time-to-wait and
    jitter (supervisors' backoff, delivery retries), so tests pass fakes here.
    """

    config: PipelineConfig
    store: CheckpointStore
    source: Source
    sinks: dict[str, Sink[Any]]
    stats: PipelineStats = field(default_factory=PipelineStats)
    clock: Clock = field(default_factory=MonotonicClock)
    rng: random.Random = field(default_factory=random.Random)
    availability: Availability = field(default_factory=Availability)
    """The source or sinks that are down right now (``/health`` says ``degraded``)."""
    durable: dict[str, Position] = field(default_factory=dict)
    """Each sink's checkpoint as last durably written (the committer keeps it current)."""
    epoch: int = 0
    """How many times the source has been opened in this run (the reader counts; see Rewind)."""
    identity: dict[str, str] | None = None
    """The source server's identity as last reconciled (FailoverReconciler; REST reads it)."""
    reconcile_records: list[dict[str, Any]] = field(default_factory=list)
    """What reconciliations found (FailoverReconciler; REST reads them)."""
    paused: bool = False
    """Paused by an operator: the reader reads nothing, also after a restart, until resumed."""
    opening: bool = False
    """The reader is (re)opening its source (its ``on_start``): it has read nothing since, and
    answers nothing until the source answers."""
    draining: bool = False
    """A drain began: a reader whose opening ends after it reads nothing (see ``opening``)."""
    snapshot: SnapshotStatus = field(default_factory=SnapshotStatus)
    """Snapshot progress (the SourceReader's SnapshotDriver writes it; REST and metrics read it)."""
    dlq: DeadLetterQueue | None = None
    """Where poison events go when ``spec.journal.enabled`` (the runner sets it)."""
    parked: dict[str, str] = field(default_factory=dict)
    """Optional sinks whose checkpoint the source no longer has (why), left out of this run (the
    SourceReader parks them; see ``SourceReader._spare``): nothing is delivered to them, and where
    the source opens no longer waits for them."""

    def held(self) -> dict[str, Position]:
        """Each sink's durable checkpoint, parked sinks left out."""
        return {s: cp for s, cp in self.durable.items() if s not in self.parked}

    def durable_min(self) -> Position | None:
        """The checkpoint every sink holds durably (parked ones aside), or None while any has none."""
        held = self.held()
        if len(held) < len(self.sinks) - len(self.parked):
            return None
        return earliest(held.values()) if held else None

    def newcomers(self) -> list[str]:
        """Sinks without a checkpoint beside sinks that hold one: added since the others' last
        run, or never delivered to."""
        return (
            [sid for sid in self.sinks if sid not in self.durable and sid not in self.parked]
            if self.durable
            else []
        )

    def resume_point(self, from_held: bool) -> Position | None:
        """Where the source opens: what every sink holds (None: the source's own start without a
        checkpoint, every change it still keeps). With :meth:`newcomers` and ``from_held`` (they
        are given a snapshot, or the source's own start is *now*), the earliest checkpoint of the
        others instead: the sinks already there would go without what lies between (a delete
        made while the pipeline was down)."""
        if from_held and (held := self.held()):
            return earliest(held.values())
        return self.durable_min()

    async def load_checkpoints(self) -> dict[str, Position]:
        """Each sink's stored checkpoint (sinks without one are left out), as positions."""
        keys = {self.key(sid): sid for sid in self.sinks}
        found = await self.store.get_many(list(keys))
        return {keys[k]: self.source.load_position(doc) for k, doc in found.items()}

    def __post_init__(self) -> None:
        for sid in self.sinks:
            self.stats.sinks.setdefault(sid, SinkStats())

    def key(self, sink_id: str) -> str:
        return sink_key(self.config.source.id, sink_id)
