"""The registry: every source, sink and processor type by name, with its config model.

The one place a new plug-in is registered. ``config.py`` looks models up here to
validate a document, ``schema.py`` to describe it, and the runner to build plug-ins
from validated settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from deltaforge.configmodel import SinkConfig, SinkSettings, SourceConfig, SourceSettings
from deltaforge.sinks.base import Sink
from deltaforge.sinks.file import FileSink, FileSinkConfig
from deltaforge.sinks.kafka import KafkaSink, KafkaSinkConfig
from deltaforge.sinks.nats import NatsSink, NatsSinkConfig
from deltaforge.sinks.postgres import PostgresSink, PostgresSinkConfig
from deltaforge.sinks.redis import RedisSink, RedisSinkConfig
from deltaforge.sinks.stdout import StdoutSink, StdoutSinkConfig
from deltaforge.sources.base import Source
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.source import MySQLSource
from deltaforge.sources.postgres.config import PostgresSourceConfig
from deltaforge.sources.postgres.source import PostgresSource
from deltaforge.sources.turso.config import TursoSourceConfig
from deltaforge.sources.turso.source import TursoSource
from deltaforge.transform.spec import PROCESSORS as PROCESSORS

S = TypeVar("S", bound=SourceSettings)
K = TypeVar("K", bound=SinkSettings)


@dataclass(frozen=True, slots=True)
class SourcePlugin(Generic[S]):
    """A source type: its config model and how to build it (settings, tenant)."""

    config: type[S]
    build: Callable[[S, str], Source]


@dataclass(frozen=True, slots=True)
class SinkPlugin(Generic[K]):
    """A sink type: its config model and how to build it."""

    config: type[K]
    build: Callable[[SinkConfig[K]], Sink[K]]


SOURCES: dict[str, SourcePlugin[Any]] = {
    "turso": SourcePlugin(TursoSourceConfig, TursoSource),
    "mysql": SourcePlugin(MySQLSourceConfig, MySQLSource),
    "postgres": SourcePlugin(PostgresSourceConfig, PostgresSource),
}
SINKS: dict[str, SinkPlugin[Any]] = {
    "file": SinkPlugin(FileSinkConfig, FileSink),
    "stdout": SinkPlugin(StdoutSinkConfig, StdoutSink),
    "redis": SinkPlugin(RedisSinkConfig, RedisSink),
    "nats": SinkPlugin(NatsSinkConfig, NatsSink),
    "kafka": SinkPlugin(KafkaSinkConfig, KafkaSink),
    "postgres": SinkPlugin(PostgresSinkConfig, PostgresSink),
}


def build_sink(cfg: SinkConfig[Any]) -> Sink[Any]:
    return SINKS[cfg.type].build(cfg)


def build_source(cfg: SourceConfig[Any], tenant: str) -> Source:
    return SOURCES[cfg.type].build(cfg.config, tenant)
