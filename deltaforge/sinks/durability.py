"""What a sink's server keeps across its own crash: read from its settings, said at start.

A sink's checkpoint moves once its server has acknowledged a batch, and what moved past is never
sent again. A server that acknowledges before the data is safe (Redis without ``appendfsync
always``, a JetStream stream held in memory) or that may throw it away later (Redis evicting
keys when memory runs out) can lose, by its own crash or choice, changes deltaforge has
checkpointed, and nothing would say so. deltaforge does not change a server's settings; each
such sink reads them once and logs what they risk and what to set (``sink_durability``, a
warning), or that it could not read them (``sink_durability_unknown``).

    >>> redis_risks({"appendonly": "yes", "appendfsync": "always", "maxmemory": "0"})
    []
    >>> [r.split(":")[0] for r in redis_risks({"appendonly": "no", "save": ""})]
    ['appendonly is no']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

REDIS_SETTINGS = ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy")
"""What :func:`redis_risks` reads (``CONFIG GET``)."""


def redis_risks(config: Mapping[str, str]) -> list[str]:
    """What Redis's ``config`` (``CONFIG GET`` of :data:`REDIS_SETTINGS`) can lose of acknowledged entries."""
    risks = []
    if config.get("appendonly") != "yes":
        saves = config.get("save") or ""
        since = f"its last RDB save (save {saves!r})" if saves else "it started (no RDB saves either)"
        risks.append(
            "appendonly is no: Redis acknowledges an XADD before anything reaches disk, so a restart or "
            f"crash of Redis loses every entry added since {since}, entries deltaforge has checkpointed "
            "and will not send again; set appendonly yes and appendfsync always"
        )
    elif (fsync := config.get("appendfsync")) != "always":
        lost = (
            "about the last second"
            if fsync == "everysec"
            else "what the kernel had not yet written (up to 30 s)"
        )
        risks.append(
            f"appendfsync is {fsync}: Redis acknowledges an XADD before it is fsynced, so a crash of its "
            f"machine (not of Redis alone) loses {lost} of entries deltaforge has checkpointed; set "
            "appendfsync always"
        )
    policy = config.get("maxmemory-policy", "")
    if policy.startswith("allkeys-") and config.get("maxmemory", "0") not in ("", "0"):
        risks.append(
            f"maxmemory-policy is {policy} with maxmemory {config['maxmemory']}: when memory runs out Redis "
            "evicts keys, streams included, and entries deltaforge delivered vanish; set noeviction "
            "(writes are then refused and deltaforge waits) or a volatile-* policy (streams have no TTL)"
        )
    return risks


def nats_risks(stream: str, storage: str, replicas: int, window_s: float, wanted_s: float) -> list[str]:
    """What a JetStream stream's settings can lose or store twice: its ``storage`` (file or memory),
    ``replicas``, and a duplicate window ``window_s`` shorter than the sink's ``wanted_s``."""
    risks = []
    if storage != "file":
        lost = "a restart of its server" if replicas <= 1 else f"a restart of all {replicas} of its servers"
        risks.append(
            f"stream {stream!r} keeps its messages in {storage}: {lost} loses every message deltaforge has "
            "checkpointed; create it with file storage"
        )
    if window_s < wanted_s:
        risks.append(
            f"stream {stream!r} drops a repeated Nats-Msg-Id only within {window_s:g} s (its duplicate_window), "
            f"less than the sink's duplicate_window_s ({wanted_s:g} s): a batch published again after a "
            f"crash more than {window_s:g} s after it was first published is stored twice; raise the "
            "stream's duplicate_window"
        )
    return risks


def kafka_risks(topic: str, replicas: int, min_insync: int | None = None) -> list[str]:
    """What a topic with ``replicas`` replicas (its fewest over its partitions) and
    ``min.insync.replicas`` ``min_insync`` (None: not known) can lose."""
    if replicas < 2:
        return [
            f"topic {topic!r} has {replicas} replica: a broker acknowledges a record once it holds it in "
            "memory (Kafka does not fsync by default), so a crash of that broker's machine, or the loss of "
            "its disk, loses records deltaforge has checkpointed; create the topic with a replication "
            "factor of 3 and min.insync.replicas=2"
        ]
    if min_insync is not None and min_insync < 2:
        return [
            f"topic {topic!r} has min.insync.replicas={min_insync}: with acks=all the leader acknowledges a "
            "record as soon as it alone holds it, in memory, whenever its followers have fallen out of sync, "
            "so a crash of the leader's machine then loses records deltaforge has checkpointed; set "
            "min.insync.replicas=2 on the topic"
        ]
    return []


TOPICS_READ = 64
"""Topics a Kafka sink reads the replicas of, at most (a topic per row would cost a round trip each)."""


class KafkaTopics:
    """The topics a Kafka sink has produced to, each read once after its first batch is acknowledged
    (it exists by then): its replicas, from a metadata round trip on the sink's own producer, and,
    for a topic with more than one, its ``min.insync.replicas`` (DescribeConfigs, one more round
    trip, on the admin client :attr:`admin` gives)."""

    def __init__(self, sink: str, timeout_s: float, admin: Callable[[], Any]) -> None:
        self.sink, self.timeout_s = sink, timeout_s
        self.read: set[str] = set()
        self.admin = admin
        """The sink's admin client (the one that reads its partitions' ends), made on first use."""

    def after_batch(self, producer: Any, topics: set[str]) -> None:
        """Read the topics of a delivered batch not read before (blocking: the sink's thread)."""
        for topic in sorted(topics - self.read):
            if len(self.read) >= TOPICS_READ:
                return
            self.read.add(topic)
            try:
                found = producer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
                replicas = min(len(p.replicas) for p in found.partitions.values())
            except Exception as exc:  # noqa: BLE001 - what the broker does not say is said as unknown
                unknown(self.sink, "KafkaSink", f"topic {topic!r}: {type(exc).__name__}: {exc}")
                continue
            min_insync = self._min_insync(topic) if replicas >= 2 else None
            report(self.sink, "KafkaSink", kafka_risks(topic, replicas, min_insync))

    def _min_insync(self, topic: str) -> int | None:
        """The topic's ``min.insync.replicas`` (None, said as unknown: the broker did not tell)."""
        # here, not at the top: the other sinks' durability checks need no Kafka client
        from confluent_kafka.admin._config import ConfigResource  # not re-exported for type checkers

        try:
            asked = self.admin().describe_configs(
                [ConfigResource("topic", topic)], request_timeout=self.timeout_s
            )
            entry = next(iter(asked.values())).result(self.timeout_s).get("min.insync.replicas")
            if entry is None or entry.value is None:
                # Tansu answers only with the settings a topic was made with
                raise LookupError("the broker does not report min.insync.replicas")
            return int(entry.value)
        except Exception as exc:  # noqa: BLE001 - what the broker does not say is said as unknown
            unknown(self.sink, "KafkaSink", f"topic {topic!r}: {type(exc).__name__}: {exc}")
            return None


def report(sink: str, actor: str, risks: list[str]) -> None:
    """Log each risk a sink's server settings carry (nothing when there is none)."""
    for risk in risks:
        structlog.get_logger().warning("sink_durability", actor=actor, sink=sink, risk=risk)


def unknown(sink: str, actor: str, reason: str) -> None:
    """The server's settings could not be read: what they risk is not known."""
    structlog.get_logger().info("sink_durability_unknown", actor=actor, sink=sink, reason=reason)
