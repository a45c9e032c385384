"""A Kafka sink's producer queue: a batch's records queued in order, and what the producer still
holds of a failed batch, dropped before the batch is retried."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from deltaforge.sinks.kafka_records import Record


def queue(producer: Producer, records: list[Record], on_delivery: Any) -> None:
    """Queue ``records`` in order, waiting for room when librdkafka's queue is full.

    Positional arguments: confluent-kafka parses keyword ones at nearly twice the cost of the
    whole call (docs/performance.md). The order is ``topic, value, key, partition, callback,
    on_delivery, timestamp, headers``; partition -1 lets the partitioner choose, timestamp 0
    means now, as their defaults do."""
    produce = producer.produce
    for topic, value, key, headers, tombstone in records:
        while True:
            try:
                produce(topic, value, key, -1, on_delivery, None, 0, headers)
                break
            except BufferError:
                producer.poll(0.1)  # queue full: let deliveries drain, then go on
        while tombstone:  # compaction then forgets the key: the null value after the delete
            try:
                produce(topic, None, key, -1, on_delivery, None, 0, headers)
                break
            except BufferError:
                producer.poll(0.1)


def discard(producer: Producer) -> None:
    """Drop what a producer being closed has not sent, then let what it sent be answered.

    Nothing still queued belongs to a confirmed batch (a batch is confirmed by a flush or a
    commit that leaves nothing behind): it is the failed batch the worker is about to retry
    whole on a new producer. Flushing it here sent it once more whenever the broker was back
    in time, and held the retry back for the flush's wait while the broker was away."""
    drop_unsent(producer)
    producer.flush(1.0)


def drop_unsent(producer: Producer) -> None:
    """Purge the records queued and not yet sent; their failure reports (``_PURGE_QUEUE``) go
    to the failed batch's callback now, not to a later call's."""
    producer.purge(in_queue=True, in_flight=False)
    producer.poll(0)


__all__ = ["discard", "drop_unsent", "queue"]
