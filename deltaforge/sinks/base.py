"""The protocol every sink implements, and its error classes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit

from deltaforge.configmodel import SinkConfig, SinkSettings
from deltaforge.events import Event
from deltaforge.position import Position, PositionDoc

if TYPE_CHECKING:
    from deltaforge.sinks.acknowledged import AckedEnds

K = TypeVar("K", bound=SinkSettings)


class SinkError(Exception):
    """A delivery failed; the subclass says whether trying again can help."""

    retryable = True


class RetryableSinkError(SinkError):
    """Connection lost, timeout, queue full: back off and try again."""


class NonRetryableSinkError(SinkError):
    """Bad credentials, message too large: trying again cannot help."""

    retryable = False


class PoisonEvent(NonRetryableSinkError):
    """An event of the batch cannot be delivered however often it is tried, by its own fault, not
    the sink's: a name template that does not resolve for it, a record too large, a row the target
    refuses. The delivery worker finds which event (see ``pipeline/delivery.py``); with the
    journal on it goes to the dead-letter queue, else the pipeline halts naming it. Connection,
    authentication, timeout and fencing errors are never this."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        """``routing``, ``too_large``, ``invalid_record`` or ``rejected``: the DLQ's error kind."""


class Sink(ABC, Generic[K]):
    """Delivers batches; ``deliver`` returns only when the batch is durable there.

    ``K`` is the sink's config model; ``self.settings`` is its validated instance.

    A batch is the unit of delivery: it succeeds or fails as a whole, and a
    retried batch holds the same events in the same order. Raise
    :class:`RetryableSinkError` or :class:`NonRetryableSinkError` to classify a
    failure, and :class:`supervision.Fatal` when the pipeline must stop.
    """

    def __init__(self, config: SinkConfig[K]) -> None:
        self.config = config
        self.settings: K = config.config
        self.id = config.id
        self.pipeline = "pipeline"  # set by the runner: names transactional ids and the like
        self.deployment = ""
        """Which deployment of the pipeline this is (``sinkids.deployment_of``: where its source
        reads; set by the runner): one config deployed once per shard runs one pipeline name
        several times."""
        self.lost_acknowledged = 0
        """How many times this run found the sink's server without what it had acknowledged
        (``acknowledged.py``, and the delivery worker for a sink that records its position)."""
        self.acknowledged: Position | None = None
        """A sink that records its position: where the last batch it acknowledged left the source
        (its delivery worker keeps it here across the worker's restarts, and in the checkpoint
        store between runs: ``pipeline/heldends.py``). The record read back may be further, never
        behind it."""
        self.unreachable: Callable[[str], None] = _nobody
        """Told, from any thread, that the sink's client library reaches none of its servers
        (``; <library> last said: …``): a delivery waiting on it is then listed unavailable at
        once, not ``UNANSWERED_S`` later. Set by the delivery worker; a library that keeps
        retrying inside a call (librdkafka) is the one to tell it."""
        self.acked_ends: AckedEnds[Any] | None = None
        """A sink that compares where its server's streams end with what they acknowledged
        (``acknowledged.py``): those marks, kept between runs by the delivery worker."""
        self.target = ""
        """The servers the sink writes to, without credentials: marks kept while it wrote
        elsewhere are not compared (``pipeline/heldends.py``)."""

    records_position = False
    """True for a sink that stores where the source stands together with each batch, atomically
    (:meth:`stored_position` reads it back): after a crash it is what the sink truly holds."""

    async def prepare(self) -> None:
        """Begin connecting, without waiting for the server or failing when it is down: called
        when the delivery worker starts, so that the connection is under way while the source
        reads its first batch. :meth:`open` then finishes it (or connects, by default)."""

    async def open(self) -> None:
        """Connect."""

    async def rewind(self, position: Position | None) -> None:
        """On an open sink whose checkpoint was set back by hand to ``position`` (None: forgotten),
        before its next batch: forget what the sink keeps of its own about what it holds, so that
        what comes again from there is written again. A sink that skips replays by a record of
        its own (a Kafka ``exactly_once`` sink's position record, a Redis stream's watermark)
        would otherwise skip what the operator asked for. Nothing by default."""

    async def reachable(self) -> None:
        """On an open sink: raise a :class:`SinkError` unless it answers now (a lagging sink is
        probed with this before the source is read again for it). By default a successful
        ``open`` is the answer; a sink whose client connects lazily makes a round trip."""

    @abstractmethod
    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        """Deliver ``events`` durably, in order; ``position`` is where the source stands once
        this batch is in (a sink that records its position stores it with the batch)."""

    async def deliver_dead_letters(self, events: list[Event]) -> None:
        """Deliver dead letters again, as they were (their idempotency keys too), recording no
        position. They are older than the changes delivered since: a sink that skips what is
        behind a mark of its own (Redis ``exactly_once``) must not skip them."""
        await self.deliver(events, None)

    async def stored_position(self) -> PositionDoc | None:
        """The position stored with the last batch this sink holds, if it records one."""
        return None

    def waiting_on(self) -> str:
        """What the sink's client library last reported while a delivery goes unanswered (a
        broker refusing connections), as ``; <library> last said: …``, or "": ``/health`` says
        it with ``delivery unanswered``, long before the batch's own error."""
        return ""

    async def close(self) -> None:
        """Flush and disconnect."""


def _nobody(_why: str) -> None:
    """No delivery worker listens (a sink used on its own)."""


def servers_of(urls: list[str], default_port: int) -> str:
    """``host:port[/path]`` of each URL, without user or password: a sink's :attr:`Sink.target`.

    >>> servers_of(["redis://u:secret@cache:6380/2"], 6379), servers_of(["nats://a", "tls://b:4223"], 4222)
    ('cache:6380/2', 'a:4222,b:4223')
    """
    out = []
    for url in urls:
        parts = urlsplit(url)
        path = parts.path.strip("/")
        out.append(f"{parts.hostname}:{parts.port or default_port}" + (f"/{path}" if path else ""))
    return ",".join(out)
