"""The protocol every sink implements, and its error classes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from deltaforge.configmodel import SinkConfig, SinkSettings
from deltaforge.events import Event

K = TypeVar("K", bound=SinkSettings)


class SinkError(Exception):
    """A delivery failed; the subclass says whether trying again can help."""

    retryable = True


class RetryableSinkError(SinkError):
    """Connection lost, timeout, queue full: back off and try again."""


class NonRetryableSinkError(SinkError):
    """Bad credentials, message too large: trying again cannot help."""

    retryable = False


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

    async def open(self) -> None:
        """Connect."""

    @abstractmethod
    async def deliver(self, events: list[Event]) -> None:
        """Deliver ``events`` durably, in order."""

    async def close(self) -> None:
        """Flush and disconnect."""
