"""The registry: every source, sink and processor type by name, with its config model.

The one place a new plug-in is registered. ``config.py`` looks models up here to
validate a document, ``schema.py`` to describe it, and the runner to build plug-ins
from validated settings.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from deltaforge.configmodel import SinkConfig, SourceConfig
from deltaforge.sinks.base import Sink
from deltaforge.sources.base import Source
from deltaforge.sources.childproc import DECODERS
from deltaforge.transform.spec import PROCESSORS as PROCESSORS


@dataclass(frozen=True, slots=True)
class Plugin:
    """A source or sink type: where its config model and its class live.

    Modules are imported when a pipeline uses the type, not before: each pulls in its client
    library (confluent-kafka, asyncpg, psycopg, redis, nats: a quarter of a second together),
    and ``serve`` on a MariaDB → file pipeline should not wait for all of them to start.
    """

    module: str
    config_name: str
    class_name: str
    decoder: str | None = None
    """A source's decoder child module (``sources/childproc.py``): ``serve`` starts one early."""

    @property
    def config(self) -> type[Any]:
        """The pydantic model of ``spec.source.config`` / a sink's ``config``."""
        return getattr(importlib.import_module(self.module), self.config_name)  # type: ignore[no-any-return]

    @property
    def build(self) -> Any:
        """The class, called with validated settings."""
        return getattr(importlib.import_module(self.module), self.class_name)


class _Source(Plugin):
    """A source type (its config model lives in the package's ``config`` module)."""

    @property
    def config(self) -> type[Any]:
        package = self.module.rpartition(".")[0]
        return getattr(importlib.import_module(f"{package}.config"), self.config_name)  # type: ignore[no-any-return]


SOURCES: dict[str, Plugin] = {
    "turso": _Source("deltaforge.sources.turso.source", "TursoSourceConfig", "TursoSource"),
    "mysql": _Source(
        "deltaforge.sources.mysql.source",
        "MySQLSourceConfig",
        "MySQLSource",
        DECODERS["mysql"],
    ),
    "postgres": _Source(
        "deltaforge.sources.postgres.source",
        "PostgresSourceConfig",
        "PostgresSource",
        DECODERS["postgres"],
    ),
    "kafka": _Source("deltaforge.sources.kafka.source", "KafkaSourceConfig", "KafkaSource"),
}
SINKS: dict[str, Plugin] = {
    "file": Plugin("deltaforge.sinks.file", "FileSinkConfig", "FileSink"),
    "stdout": Plugin("deltaforge.sinks.stdout", "StdoutSinkConfig", "StdoutSink"),
    "redis": Plugin("deltaforge.sinks.redis", "RedisSinkConfig", "RedisSink"),
    "nats": Plugin("deltaforge.sinks.nats", "NatsSinkConfig", "NatsSink"),
    "kafka": Plugin("deltaforge.sinks.kafka", "KafkaSinkConfig", "KafkaSink"),
    "postgres": Plugin("deltaforge.sinks.postgres", "PostgresSinkConfig", "PostgresSink"),
}


def build_sink(cfg: SinkConfig[Any]) -> Sink[Any]:
    sink: Sink[Any] = SINKS[cfg.type].build(cfg)
    return sink


def decoder_module(source_type: str) -> str:
    """The decoder child module of a source type that has one (its sources spawn it from here,
    and ``serve`` starts one early: the two cannot disagree)."""
    module = SOURCES[source_type].decoder
    if module is None:
        raise LookupError(f"source type {source_type!r} has no decoder child")
    return module


def build_source(cfg: SourceConfig[Any], tenant: str) -> Source:
    source: Source = SOURCES[cfg.type].build(cfg.config, tenant)
    return source
