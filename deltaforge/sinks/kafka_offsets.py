"""Where an ``exactly_once`` Kafka sink left the source: the offsets topic read back.

Each committed batch writes its source position to the offsets topic in the same transaction
as its records (see ``kafka.py``), keyed ``<pipeline>/<sink>``. After a crash the last such
record, read with ``read_committed``, is what the topic truly holds.
"""

from __future__ import annotations

import logging
import time

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

from deltaforge.position import PositionDoc
from deltaforge.sinks.base import RetryableSinkError

LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
IDLE_END_S = 1.0  # reading the offsets topic: this long with nothing new is its end


def read_position(brokers: str, topic: str, key: bytes, timeout: float) -> PositionDoc | None:
    """The last committed position recorded under ``key`` in ``topic`` (read_committed), if any."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"deltaforge-position-{key.decode()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 3,
            "logger": LIBRDKAFKA_LOG,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        found: PositionDoc | None = None
        idle_since = time.monotonic()
        # Read to the end. Watermarks would say where the end is, but Kafka-compatible brokers
        # disagree on them (Tansu's count batches), so the end is when nothing more comes.
        while time.monotonic() - idle_since < IDLE_END_S:
            msgs = consumer.consume(500, 0.2)
            for m in msgs:
                value = m.value()
                if m.error() is None and m.key() == key and value is not None:
                    found = orjson.loads(value)["position"]
            if msgs:
                idle_since = time.monotonic()
        return found
    except KafkaException as exc:
        raise RetryableSinkError(f"cannot read positions from {topic!r}: {exc.args[0].str()}") from None
    finally:
        consumer.close()
