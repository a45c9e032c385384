"""Pipelines of one ``serve`` that would read one thing that takes one reader: checked when a
folder of configs is read, each pair refused naming both.

* A PostgreSQL slot of one database (the default ``deltaforge`` in two documents): a slot has
  one reader, so the second would wait for ever (``degraded``, naming the first's connection).
* A Kafka consumer group on one cluster: Kafka splits the partitions between the members, so
  each would deliver part of the records without a word.

Pipelines of two processes are not seen here; at run time a busy slot is said (the PostgreSQL
decoder child), and a shared group is Kafka's scale-out of one pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from deltaforge.config import PipelineConfig


def shared_readers(pipelines: list[PipelineConfig]) -> list[str]:
    """Every such pair, as configuration errors."""
    return _shared_slots(pipelines) + _shared_groups(pipelines)


def _shared_slots(pipelines: list[PipelineConfig]) -> list[str]:
    """Pipelines whose PostgreSQL sources read one database with one slot (the default
    ``deltaforge`` in two documents): a slot has one reader, so the second would wait for ever."""
    readers: dict[tuple[str, str], str] = {}
    errors = []
    for pc in pipelines:
        if pc.source.type != "postgres":
            continue
        cfg = pc.source.config
        where = _database(str(getattr(cfg, "dsn", "")))
        slot = str(getattr(cfg, "slot", ""))
        first = readers.setdefault((where, slot), pc.name)
        if first != pc.name:
            errors.append(
                f"spec.source.config.slot: pipelines {first!r} and {pc.name!r} read slot {slot!r} of one database "
                f"({where}): a slot has one reader, so one would wait for ever; give each a slot and "
                "publication of its own"
            )
    return errors


def _database(dsn: str) -> str:
    """``host:port/dbname`` of a PostgreSQL DSN, a URL or ``key=value`` words (no credentials)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        hosts = parts.netloc.rpartition("@")[2].lower()
        if "," not in hosts:  # one host: its default port said, so db and db:5432 are one database
            hosts = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
        return f"{hosts}{parts.path}"
    words = dict(w.split("=", 1) for w in dsn.split() if "=" in w)
    return f"{words.get('host', 'localhost')}:{words.get('port', '5432')}/{words.get('dbname', '')}"


def _shared_groups(pipelines: list[PipelineConfig]) -> list[str]:
    """Pipelines whose Kafka sources read one cluster (a broker in common) in one consumer group:
    Kafka splits the partitions between them, so each would deliver part of the records."""
    seen: list[tuple[set[str], str, str]] = []  # brokers, group, pipeline
    errors = []
    for pc in pipelines:
        if pc.source.type != "kafka":
            continue
        cfg = pc.source.config
        brokers = {b.strip().lower() for b in str(getattr(cfg, "brokers", "")).split(",") if b.strip()}
        group = str(getattr(cfg, "group_id", ""))
        for others, their_group, first in seen:
            if their_group == group and (common := brokers & others):
                errors.append(
                    f"spec.source.config.group_id: pipelines {first!r} and {pc.name!r} read one cluster "
                    f"({', '.join(sorted(common))}) in consumer group {group!r}: Kafka splits the partitions "
                    "between them, so each would deliver part of the records; give each a group of its own"
                )
                break
        else:
            seen.append((brokers, group, pc.name))
    return errors
