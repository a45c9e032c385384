"""Messages between the pipeline's actors: frozen, typed, named as facts or commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors import message
from deltaforge.events import Event


@dataclass(frozen=True, slots=True)
class Batch:
    """The unit of delivery and of checkpointing: events in source order.

    ``last`` is the last source event the batch covers. Processors may drop
    events, the last one included, or all of them: the batch still moves every
    sink's checkpoint past what was read, or a filtered table would be re-read
    on every restart (and hold a PostgreSQL slot's WAL forever).
    """

    id: int
    events: list[Event]
    size_bytes: int
    last: Event | None = None

    @property
    def end(self) -> Event:
        return self.last if self.last is not None else self.events[-1]

    @property
    def checkpoint(self) -> dict[str, Any]:
        """Where a sink stands once it has this batch."""
        return self.end.checkpoint

    @property
    def last_order(self) -> tuple[int, ...]:
        return self.end.order


@message
class ReadNext:
    """SourceReader to itself: read the next chunk."""


@message
class StopReading:
    """Stop reading (graceful drain); replies once no more chunks will be sent."""


@message
class EventsRead:
    """A chunk of events from the source, in order."""

    events: list[Event]


@message
class FlushDue:
    """Timer tick: flush a partial batch older than max_ms."""


@message
class FlushNow:
    """Flush whatever complete transactions are buffered (graceful drain)."""


@message
class DeliverBatch:
    """Deliver this batch (accumulator to coordinator, coordinator to workers)."""

    batch: Batch


@message
class BatchDelivered:
    """A worker's reply: the batch is durable in its sink, which now stands at ``checkpoint``."""

    sink_id: str
    batch_id: int
    checkpoint: dict[str, Any]
    events: int


@message
class DeliveryFailed:
    """A worker's reply: the batch is not in its sink."""

    sink_id: str
    batch_id: int
    reason: str
    retryable: bool


@message
class CommitCheckpoint:
    """Store these per-sink checkpoints atomically (coordinator to committer)."""

    batch_id: int
    checkpoints: dict[str, dict[str, Any]]


@message
class JobDone:
    """SparkTransformer to itself: a batch's Spark job finished; forward what is ready."""


@message
class Barrier:
    """Replies once every batch enqueued before it is done (graceful drain)."""
