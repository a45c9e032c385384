"""What a Kafka sink's producer still holds of a failed batch, dropped before the batch is retried."""

from __future__ import annotations

from confluent_kafka import Producer


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


__all__ = ["discard", "drop_unsent"]
