"""Sinks: each delivers a batch of events to one system and says when it is durable."""

from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, Sink, SinkError

__all__ = ["NonRetryableSinkError", "RetryableSinkError", "Sink", "SinkError"]
