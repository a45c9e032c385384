"""A new producer's topics asked for by metadata requests as soon as its first records are queued.

An idempotent producer sends nothing before it has a producer id. librdkafka asks for one when a
metadata answer arrives, and only from a broker the cluster named whose connection is up;
failing that, it tries again on a 500 ms timer, and nothing else wakes it. Left to itself, a new
producer (a start, a restart, the retry after an outage) often waited that timer, once or twice,
for its first acknowledgement (docs/performance.md has the figures).

An answer from the bootstrap connection is asked again, up to :data:`ASKS` times: it answers
before the named brokers' connections are up (and closes once they are known), so it woke
nothing, and about one start in four still waited the timer.
"""

from __future__ import annotations

import contextlib

from confluent_kafka import KafkaException, Producer

LEARN_S = 5.0
"""How long asking for a new topic's metadata may hold a batch (the flush after it says what is wrong)."""
ASKS = 3
"""How often one topic's metadata is asked while only a bootstrap connection answers."""


def learn(producer: Producer, topics: set[str], learned: set[str], timeout: float) -> None:
    """Ask for the metadata of each of ``topics`` that ``producer`` was not asked about yet;
    ``learned`` (the topics it was asked about) takes them in."""
    for topic in sorted(topics - learned):
        learned.add(topic)
        with contextlib.suppress(KafkaException):  # no answer now: the flush that follows says so
            ask(producer, topic, timeout)


def ask(producer: Producer, topic: str | None, timeout: float) -> None:
    """A metadata request (all topics, or ``topic``), asked again while only the bootstrap
    connection answers it, up to :data:`ASKS` times."""
    for _ in range(ASKS):
        answer = producer.list_topics(topic, timeout=min(timeout, LEARN_S))
        if answer.orig_broker_id >= 0:  # a named broker (bootstrap connections are -1)
            return
