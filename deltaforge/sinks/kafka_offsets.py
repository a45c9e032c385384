"""Where an ``exactly_once`` Kafka sink left the source: the offsets topic read back.

Each committed batch writes its source position to the offsets topic in the same transaction
as its records (see ``kafka.py``), keyed ``<pipeline>/<sink>``. After a crash the last such
record, read with ``read_committed``, is what the topic truly holds.
"""

from __future__ import annotations

import logging
import time

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from deltaforge.position import PositionDoc
from deltaforge.sinks.base import RetryableSinkError

LIBRDKAFKA_LOG = logging.getLogger("librdkafka")


def read_position(brokers: str, topic: str, key: bytes, timeout: float) -> PositionDoc | None:
    """The last committed position recorded under ``key`` in ``topic`` (read_committed), if any."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"deltaforge-position-{key.decode()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
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
        # Read to the end: each partition's EOF, as the consumer reports it. Not the watermarks
        # (Tansu answers them as the last record batch's base offset + 1), and not "nothing came
        # for a while": a broker slower than that while would hide the newest position.
        reading = set(meta.partitions)
        deadline = time.monotonic() + timeout
        while reading:
            if time.monotonic() > deadline:
                raise RetryableSinkError(
                    f"cannot read positions from {topic!r}: not at its end in {timeout:g} s"
                )
            for m in consumer.consume(500, 0.2):
                err, value = m.error(), m.value()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        reading.discard(int(m.partition() or 0))
                elif m.key() == key and value is not None:
                    found = orjson.loads(value)["position"]
        return found
    except KafkaException as exc:
        raise RetryableSinkError(f"cannot read positions from {topic!r}: {exc.args[0].str()}") from None
    finally:
        consumer.close()
