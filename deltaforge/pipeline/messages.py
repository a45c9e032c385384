"""Messages between the pipeline's actors: frozen, typed, named as facts or commands."""

from __future__ import annotations

from dataclasses import dataclass

from actors import Ask, message
from deltaforge.events import Event
from deltaforge.position import Position


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
    epoch: int = 0
    """The reading it came from: each (re)open of the source starts a new one (see Rewind)."""

    @property
    def end(self) -> Event:
        return self.last if self.last is not None else self.events[-1]

    @property
    def checkpoint(self) -> Position:
        """Where a sink stands once it has this batch."""
        return self.end.checkpoint

    @property
    def last_order(self) -> tuple[int, ...]:
        return self.end.order


@message
class ReadNext:
    """SourceReader to itself: read the next chunk."""


@message
class StopReading(Ask[bool]):
    """Stop reading (graceful drain); replies once no more chunks will be sent."""


@message
class ReleaseHeld(Ask[bool]):
    """Drain, at its end: tell the source what every sink now holds (a Kafka source commits its
    group's offsets), as reading would have before its next read."""


@message
class EventsRead:
    """A chunk of events from the source, in order, from reading ``epoch``; ``caught_up``: the
    source had nothing more ready when it was read (hand a partial batch on now). With no
    events, only that: the source said more was coming, and none of it was events."""

    events: list[Event]
    epoch: int = 0
    caught_up: bool = False


@message
class Rewind:
    """Coordinator to reader: open the source again from the minimum durable checkpoint, so a
    sink that fell behind and is back gets what it missed, in this run."""


@message
class ProbeSink(Ask[str | None]):
    """Coordinator to a lagging sink's worker: can you reach your sink? None if so, else why not."""


@message
class ResumeReading(Ask[bool]):
    """Runner to the reader, after StopReading (a pause): read again from where it stopped."""


@message
class TakeSnapshot(Ask["dict[str, object] | Exception"]):
    """REST or CLI to the reader: snapshot ``tables`` while streaming goes on. The reply is the
    snapshot's status, or why it cannot be taken (for the caller to show, not a crash)."""

    tables: tuple[str, ...]
    by: str = "api"


@message
class ReplayDeadLetters(Ask[str | None]):
    """REST to a worker: deliver these dead letters again; None once they are in the sink, else why not."""

    events: tuple[Event, ...]


@message
class ProbeLagging:
    """Coordinator's timer tick: time to see whether lagging sinks are back."""


@message
class SinksProbed:
    """The probe of lagging sinks, done beside delivery: each sink and why it is not back (None:
    back), or the :class:`~supervision.Fatal` a probe raised."""

    answers: tuple[tuple[str, str | None], ...]
    fatal: BaseException | None = None


@message
class FlushDue:
    """Timer tick: flush a partial batch older than max_ms."""


@message
class FlushNow(Ask[bool]):
    """Flush whatever complete transactions are buffered (graceful drain)."""


@message
class DeliverBatch:
    """Deliver this batch (accumulator to transformer or coordinator, transformer to coordinator)."""

    batch: Batch


@message
class BatchDelivered:
    """A worker's reply: the batch is durable in its sink, which now stands at ``checkpoint``."""

    sink_id: str
    batch_id: int
    checkpoint: Position
    events: int


@message
class DeliveryFailed:
    """A worker's reply: the batch is not in its sink."""

    sink_id: str
    batch_id: int
    reason: str
    retryable: bool


@message
class DeliverTo(Ask[BatchDelivered | DeliveryFailed]):
    """Deliver this batch to your sink (coordinator to a worker); the reply says how it went."""

    batch: Batch


@message
class CommitCheckpoint(Ask[int]):
    """Store these per-sink checkpoints atomically (coordinator to committer); replies with
    the batch id once they are durable."""

    batch_id: int
    checkpoints: dict[str, Position]


@message
class CheckpointWritten:
    """DeliveryCoordinator to itself: the checkpoint write it started has ended; take its result."""


@message
class JobDone:
    """SparkTransformer to itself: a batch's Spark job finished; forward what is ready."""


@message
class Barrier(Ask[bool]):
    """Replies once every batch enqueued before it is done (graceful drain)."""
