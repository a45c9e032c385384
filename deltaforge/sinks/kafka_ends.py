"""Where a default-mode Kafka sink's partitions end, read back: a broker that lost records it
acknowledged is named (``acknowledged.py``).

The sink asks librdkafka for failed records' reports only (``delivery.report.only.error``, for
throughput), so it never sees the offsets its records got. It reads each partition's end (its
latest offset) instead, before a batch: at most once a second, and before the first batch after
anything went wrong (a failed batch, a connection librdkafka reported lost). An end never moves
back while the broker keeps what it acknowledged (retention and compaction move a partition's
start, not its end); an end behind one read earlier means records that were there, this sink's
acknowledged ones among them, are gone: a broker that came back without its data, a topic
deleted and made again. Reading before the batch, not after it, keeps the batch's own records
from covering the loss.

What is not seen: a loss smaller than what was written after the last reading (other producers
to the same partitions, or a broker that lost data and took more than that back before the next
reading). The ends read are kept between runs (``pipeline/heldends.py``), so a loss while the
sink was stopped is seen at its next run. ``exactly_once`` sinks check their position record
instead (``pipeline/delivery.py``).
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # not re-exported for type checkers

from actors import let_go
from deltaforge.sinks import durability
from deltaforge.sinks.acknowledged import AckedEnds
from deltaforge.sinks.durability import TOPICS_READ

READ_EVERY_S = 1.0
"""Without a disturbance, the ends are read before a batch at most this often (two round trips)."""

_REFUSED = ("AUTHORIZATION", "AUTHENTICATION")
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]


class PartitionEnds:
    """The ends of the partitions of the topics one sink produced to, compared with the last read.

    Used from the sink's worker thread only (librdkafka calls block)."""

    def __init__(self, sink: str, timeout_s: float) -> None:
        self.sink, self.timeout_s = sink, timeout_s
        self.conf: dict[str, Any] = {}
        """The reading client's settings: the producer's servers, client id and security settings."""
        self.acked = AckedEnds[int](sink, "KafkaSink", "offset")
        self.partitions: dict[str, list[int] | None] = {}
        """Each topic produced to (``None``: its partitions not read yet)."""
        self.disturbed = False
        self.read_at = 0.0
        self.refused = False
        self._admin: AdminClient | None = None

    def disturb(self, _err: KafkaError | None = None) -> None:
        """Something went wrong: read the ends before the next batch. Also the producer's
        ``error_cb`` (a lost connection, all brokers down: librdkafka's own log lines say so)."""
        self.disturbed = True

    def produced_to(self, topics: set[str]) -> None:
        """Topics of a batch the broker acknowledged; their ends are read from the next reading on."""
        for topic in topics:
            if topic not in self.partitions and len(self.partitions) < TOPICS_READ:
                self.partitions[topic] = None

    def check(self) -> int:
        """Before a batch: the partitions whose end is behind what was read before (each logged as
        ``sink_lost_acknowledged``, once per loss); how many. A reading that fails is tried again
        before the next batch."""
        now = time.monotonic()
        if self.refused or not self.partitions or (not self.disturbed and now - self.read_at < READ_EVERY_S):
            return 0
        try:
            ends = self._read()
        except Exception as exc:  # noqa: BLE001 - not read now: read before the next batch
            name = exc.args[0].name() if isinstance(exc, KafkaException) and exc.args else type(exc).__name__
            if any(word in name for word in _REFUSED):
                self.refused = True  # a user that may produce but not describe: no check, said once
                durability.unknown(self.sink, "KafkaSink", f"partition ends not readable: {name}")
            self.disturbed = True
            # Its frames hold the client and the futures that hold it: a cycle the collector
            # frees late, the client's threads and sockets running on meanwhile (let_go).
            let_go(exc)
            # The next reading on a new client: one whose connection went silent for good (a
            # vanished host, a NAT that forgot it) answers nothing until librdkafka gives the
            # connection up (socket.timeout.ms, a minute), and each batch waited for it meanwhile.
            self._admin = None
            return 0
        self.disturbed, self.read_at = False, now
        return sum(self.acked.check(where, end, end) for where, end in ends.items())

    def admin(self) -> AdminClient:
        """The admin client, made with :attr:`conf` on first use; the sink's topic reads use it too."""
        if self._admin is None:
            self._admin = AdminClient(self.conf)
        return self._admin

    def _read(self) -> dict[str, int]:
        admin = self.admin()
        wait = min(self.timeout_s, 5.0)
        asked: dict[TopicPartition, str] = {}
        ends: dict[str, int] = {}
        for topic, known in self.partitions.items():
            if known is None or self.disturbed:
                found = admin.list_topics(topic, timeout=wait).topics.get(topic)
                if found is not None and found.error is not None:
                    if found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise KafkaException(found.error)  # no leader yet, not allowed: not read now
                    found = None
                known = [] if found is None else sorted(found.partitions)
                self.partitions[topic] = known
            for p in known:
                asked[TopicPartition(topic, p)] = f"{topic}[{p}]"
            for where in self.acked.ends:
                if where.startswith(f"{topic}[") and where not in asked.values():
                    ends[where] = 0  # a partition (or topic) that is no more: nothing of it is left
        if asked:
            futures = admin.list_offsets(dict.fromkeys(asked, _LATEST), request_timeout=wait)
            for tp, future in futures.items():
                end = int(future.result().offset)
                if end < 0:  # OFFSET_INVALID (-1001): librdkafka's answer to a request that timed out
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{asked[tp]}: no end read"))
                ends[asked[tp]] = end
        return ends
