"""Source and sink types by name: the one place a new plug-in is registered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltaforge.config import SinkConfig, SourceConfig
from deltaforge.sinks.base import Sink
from deltaforge.sinks.file import FileSink
from deltaforge.sinks.kafka import KafkaSink
from deltaforge.sinks.nats import NatsSink
from deltaforge.sinks.postgres import PostgresSink
from deltaforge.sinks.redis import RedisSink
from deltaforge.sinks.stdout import StdoutSink
from deltaforge.sources.base import Source
from deltaforge.sources.mysql import MySQLSource
from deltaforge.sources.postgres import PostgresSource
from deltaforge.sources.turso import TursoSource

SINKS: dict[str, Callable[[SinkConfig], Sink]] = {
    "file": FileSink,
    "stdout": StdoutSink,
    "redis": RedisSink,
    "nats": NatsSink,
    "kafka": KafkaSink,
    "postgres": PostgresSink,
}
SOURCES: dict[str, Callable[[dict[str, Any], str], Source]] = {
    "turso": TursoSource,
    "mysql": MySQLSource,
    "postgres": PostgresSource,
}


def build_sink(cfg: SinkConfig) -> Sink:
    return SINKS[cfg.type](cfg)


def build_source(cfg: SourceConfig, tenant: str) -> Source:
    return SOURCES[cfg.type](cfg.config, tenant)
