"""Where an ``exactly_once`` Kafka sink left the source: the offsets topic read back.

Each committed batch writes its source position to the offsets topic in the same transaction
as its records (see ``kafka.py``), keyed ``<pipeline>/<sink>``. After a crash the last such
record, read with ``read_committed``, is what the topic truly holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from deltaforge.envelopes import encode
from deltaforge.position import Position, PositionDoc
from deltaforge.sinks.base import RetryableSinkError
from deltaforge.sinks.kafka_settings import LIBRDKAFKA_LOG

_WAIT_S = 0.01
"""How long one ``consume`` call waits: it returns early only with all 500 records it may take,
so the wait is paid on every call that gets fewer (0.2 s had paced a restart's first
exactly_once batch by about 200 ms per call; docs/performance.md)."""


def position_record(position: Position | None) -> bytes:
    """The record value saying where a batch left the source (a null position: read back as no
    record, what a rewind to the start writes)."""
    if position is None:
        return encode({"position": None, "order": None})
    return encode({"position": position.to_doc(), "order": list(position.order)})


def read_position(reach: Mapping[str, Any], topic: str, key: bytes, timeout: float) -> PositionDoc | None:
    """The last committed position recorded under ``key`` in ``topic`` (read_committed), if any.
    ``reach``: how to reach the brokers (``bootstrap.servers``, the sink's security settings)."""
    consumer = Consumer(
        {
            "log_level": 3,
            "logger": LIBRDKAFKA_LOG,
            **reach,
            "group.id": f"deltaforge-position-{key.decode()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # a partition read to its end: the broker answers at once instead of holding the
            # fetch open for more (500 ms by default), so its end is reported without that wait
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        last: dict[int, tuple[int, bytes]] = {}  # partition -> its last record's timestamp and value
        for m in read_to_end(consumer, set(meta.partitions), timeout):
            value = m.value()
            if m.key() == key and value is not None:
                last[m.partition() or 0] = (m.timestamp()[1], value)
        if not last:
            return None
        # One partition holds a key's records, in order. Two do when the partitioner changed under
        # the topic (deltaforge chose librdkafka's CRC32 default before Java's murmur2): the
        # newer is then the one written later.
        position: PositionDoc = orjson.loads(max(last.values(), key=lambda tv: tv[0])[1])["position"]
        return position
    except KafkaException as exc:
        raise RetryableSinkError(f"cannot read positions from {topic!r}: {exc.args[0].str()}") from None
    finally:
        consumer.close()


def read_to_end(consumer: Consumer, partitions: set[int], timeout: float) -> Iterator[Message]:
    """Every record of the assigned ``partitions`` up to each one's EOF, as the consumer reports
    it (``enable.partition.eof``). Not the watermarks: Tansu answers them as the last record
    batch's base offset + 1. Not "nothing came for a while": a slower broker would hide the end.
    Not at the end within ``timeout``: :class:`RetryableSinkError`."""
    reading = set(partitions)
    deadline = time.monotonic() + timeout
    while reading:
        if time.monotonic() > deadline:
            raise RetryableSinkError(
                f"kafka: partitions {sorted(reading)} not read to their end in {timeout:g} s"
            )
        for m in consumer.consume(500, _WAIT_S):
            err = m.error()
            if err is None:
                yield m
            elif err.code() == KafkaError._PARTITION_EOF:
                reading.discard(int(m.partition() or 0))
