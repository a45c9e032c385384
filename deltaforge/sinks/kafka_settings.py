"""A Kafka sink's settings (:class:`KafkaSinkConfig`), and of them the librdkafka settings it
passes on as given (``producer``), and those it may not.

deltaforge checkpoints a batch once the broker has acknowledged every record of it with
``acks=all`` from an idempotent producer (or once its transaction commits). A setting that
weakens that would let a checkpoint pass records a broker failover then loses, or duplicates
a retry would write: refused when the config is read, naming it.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from deltaforge.configmodel import Bool, Brokers, PositiveNumber, SinkSettings, Text, fail
from deltaforge.sinks.kafka_names import TopicTemplate
from deltaforge.sinks.templates import Template

LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
"""Where every librdkafka client of a Kafka sink logs (its ``logger`` setting): JSON lines (logsetup)."""

ProducerValue = str | int | float | bool


def _acks(value: Any) -> str | None:
    if str(value).lower() in ("all", "-1"):
        return None
    return (
        f"acks={value}: deltaforge needs acks=all (every in-sync replica holds a record before its "
        "batch is checkpointed; with fewer, a broker failover loses acknowledged records)"
    )


def _idempotence(value: Any) -> str | None:
    if value is True or str(value).lower() == "true":
        return None
    return (
        f"enable.idempotence={value}: deltaforge needs the idempotent producer (a retried batch "
        "would otherwise write its records twice, or out of order)"
    )


def _transactional_id(value: Any) -> str | None:
    return (
        "transactional.id: set by deltaforge for exactly_once (one per pipeline and sink, so a "
        "restart fences the old producer); use exactly_once: true instead"
    )


_GUARDED = {
    "acks": _acks,
    "request.required.acks": _acks,
    "enable.idempotence": _idempotence,
    "transactional.id": _transactional_id,
}


def _check(settings: dict[str, ProducerValue]) -> dict[str, ProducerValue]:
    problems = [
        why for key, value in settings.items() if (check := _GUARDED.get(key)) and (why := check(value))
    ]
    if problems:
        fail("; ".join(problems))
    return settings


ProducerSettings = Annotated[dict[str, ProducerValue], AfterValidator(_check)]
"""``producer``: more librdkafka settings, passed as given, except those that would weaken delivery."""

_CONNECTION = ("security.", "ssl.", "ssl_", "sasl.", "enable.ssl.", "enable.sasl.", "socket.", "broker.",
               "client.dns.", "api.version.", "https.")  # fmt: skip


def producer_settings(cfg: KafkaSinkConfig, client_id: str) -> dict[str, Any]:
    """The producer's librdkafka settings: deltaforge's, then the ``producer`` ones given (checked
    as the config was read)."""
    return {
        "bootstrap.servers": cfg.brokers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # Java's partitioner (murmur2), as Debezium and Kafka Streams use: a row's records land
        # where a Java client puts its key, not where librdkafka's CRC32 default would.
        "partitioner": "murmur2_random",
        "message.timeout.ms": int(cfg.timeout_s * 1000),
        "log_level": 3,
        "client.id": client_id,
        "logger": LIBRDKAFKA_LOG,  # JSON lines (logsetup), not bare text on stderr
        # Success reports would cost a Python callback (and a Message object) per record:
        # only failures are reported; flush()/commit_transaction() confirm the rest.
        "delivery.report.only.error": True,
        "compression.type": cfg.compression,
        **cfg.producer,
    }


def connection_settings(cfg: KafkaSinkConfig) -> dict[str, Any]:
    """What the sink's other clients need to reach the same brokers: the consumer reading its
    position record back, the client reading its partitions' ends. Of ``producer``, the security
    and socket settings only; not the producer's own, which a consumer would log as ignored.

    >>> cfg = KafkaSinkConfig(id="k", brokers="b:9092", topic="t", producer={"security.protocol": "SSL", "linger.ms": 20})
    >>> {k: v for k, v in connection_settings(cfg).items() if k != "logger"}
    {'bootstrap.servers': 'b:9092', 'log_level': 3, 'security.protocol': 'SSL'}
    """
    chosen = {k: v for k, v in cfg.producer.items() if k.startswith(_CONNECTION)}
    return {"bootstrap.servers": cfg.brokers, "log_level": 3, "logger": LIBRDKAFKA_LOG, **chosen}


class KafkaSinkConfig(SinkSettings):
    """Kafka (or a Kafka-protocol broker): one record per event, idempotent producer."""

    brokers: Brokers = Field(description="bootstrap.servers: host:port[,host:port...]")
    topic: TopicTemplate = Field(description="Topic per event, e.g. cdc.${source.table}.")
    key: Template | None = Field(
        None, description='Record key per event (default: the primary key as JSON, {"id": 1}).'
    )
    tombstones: Bool = Field(
        False, description="After a delete, a record with the same key and a null value."
    )
    exactly_once: Bool = Field(
        False, description="One Kafka transaction per batch (read_committed sees it whole)."
    )
    timeout_s: PositiveNumber = Field(30.0, description="How long a batch may take to be acknowledged.")
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none", description="Record batch compression (compression.type)."
    )
    offsets_topic: Text = Field(
        "deltaforge.offsets",
        description="exactly_once: where each batch's source position is written in its transaction "
        "(make it compacted).",
    )
    producer: ProducerSettings = Field(
        default_factory=dict,
        description="More librdkafka producer settings, passed as given (not acks, enable.idempotence "
        "or transactional.id: deltaforge sets them).",
    )
