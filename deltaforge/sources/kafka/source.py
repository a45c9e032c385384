"""A Kafka source: topics consumed by a group with aiokafka, offsets committed after delivery.

DataFlow Operator's rule: the group's offsets move only once the sinks hold what they cover, so a
crash re-reads and never skips. Nothing is auto-committed: ``confirm`` (called with what every sink
holds durably) commits it, and the pipeline's checkpoint store keeps the same offsets, which win on
resume when they are further (the group's are, at most, as far). Per-partition order is kept;
partitions interleave freely, so positions are a :class:`~deltaforge.position.PartitionedPosition`.

Rebalances: a revoked partition's durable offset is committed as the partition goes (never more);
batches of it already read are still delivered, and the next owner reads them again from there. An
assigned partition starts at the further of the checkpoint and the group's committed offset, else at
``start``; an offset the broker no longer has halts with ``position lost`` instead of skipping.

``start: latest`` leaves out what the topics held when the pipeline first started, and nothing
written since: a partition there then starts at its end as it was then (not as it is once the group
hands it over), and a partition made later (a topic a pattern matches, made while the pipeline runs
or while it is stopped) at its first record. Starting such a partition at its end, as a consumer's
``auto.offset.reset=latest`` does, skipped every record written to it before the consumer first
saw it (up to ``metadata.max.age.ms``, five minutes by default, later).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)

from deltaforge.events import Event, SourceInfo, new_event
from deltaforge.position import Position, PositionDoc
from deltaforge.sources.base import (
    PositionLost,
    Source,
    SourceError,
    SourceMisconfigured,
    SourceUnavailable,
    own_position,
)
from deltaforge.sources.kafka.config import KafkaSourceConfig
from deltaforge.sources.kafka.position import KafkaPosition, Offset
from deltaforge.sources.kafka.records import Malformed, Record, RecordReader

COMMIT_TIMEOUT_S = 10.0
IDLE_PROBE_S = 2.0
PROBE_S = 10.0
"""How long a probe waits for the cluster's metadata: aiokafka's own request timeout is 40 s, and a
connection gone silent (the broker's host vanished, a NAT forgot it) was said only after it."""
CLOSE_TIMEOUT_S = 3.0  # then the broker drops this member after its session timeout instead
TOPIC_DISCOVERY_MS = 5_000
"""How often the consumer asks for the brokers' topics (aiokafka's ``metadata_max_age_ms``): a
topic a pattern matches is read this soon after it is made, not five minutes later."""
_DOWN = (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RequestTimedOutError)
_REFUSED = (GroupAuthorizationFailedError, TopicAuthorizationFailedError)

log = structlog.get_logger()


class MalformedRecord(SourceMisconfigured):
    """A record not in the declared format, with the journal off: halt, naming where it is."""


def _failure(exc: KafkaError, doing: str) -> Exception:
    if isinstance(exc, _DOWN):
        return SourceUnavailable(f"kafka {doing}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _REFUSED):
        return SourceMisconfigured(f"kafka {doing}: {type(exc).__name__}: {exc}")
    return SourceError(f"kafka {doing}: {type(exc).__name__}: {exc}")


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.source.revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.source.assigned(assigned)


class KafkaSource(Source):
    """Reads the records of ``topics`` as events (see the module)."""

    connector = "kafka"

    def __init__(self, cfg: KafkaSourceConfig, tenant: str = "default") -> None:
        self.id = cfg.id
        self.cfg = cfg
        self.tenant = tenant
        self.records = RecordReader(cfg.format, tenant)
        self.consumer: AIOKafkaConsumer | None = None
        self.next: dict[tuple[str, int], int] = {}
        """Each partition's next offset: the resume point, moved by every record read."""
        self.durable: KafkaPosition | None = None
        self.committed: dict[tuple[str, int], int] = {}
        self.full = False
        self.unchecked: set[TopicPartition] = set()  # assigned since the last read
        self.probed = 0.0
        self.edges: dict[tuple[str, int], int] | None = None
        """``start: latest``: each partition's end when the pipeline first started, taken once; a
        partition not among them was made since and starts at its beginning (see the module)."""

    async def open(self, resume_after: Position | None) -> None:
        start = own_position(resume_after, KafkaPosition)
        self.next = start.next_offsets() if start else {}
        self.durable, self.committed, self.unchecked = start, {}, set()
        cfg = self.cfg
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.brokers, group_id=cfg.group_id, client_id=f"deltaforge-{cfg.id}",
            enable_auto_commit=False, auto_offset_reset="none", isolation_level="read_committed",
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=min(3000, cfg.session_timeout_ms // 3),  # three beats per session
            metadata_max_age_ms=TOPIC_DISCOVERY_MS,
        )  # fmt: skip
        try:
            await consumer.start()
            if self.edges is None:
                # With a checkpoint this is not the first start: what it does not hold was made since.
                self.edges = await self._ends(consumer) if cfg.start == "latest" and start is None else {}
        except KafkaError as exc:
            await consumer.stop()
            raise _failure(exc, f"connecting to {cfg.brokers}") from None
        except BaseException:  # the ends not read in time (SourceUnavailable), a cancellation
            await consumer.stop()
            raise
        listener = _Rebalance(self)
        if cfg.pattern is not None:
            consumer.subscribe(pattern=cfg.pattern, listener=listener)
        else:
            consumer.subscribe(topics=cfg.topic_names, listener=listener)
        self.consumer = consumer

    @property
    def starts_at_oldest(self) -> bool:
        # With start: latest a partition with no checkpoint and no committed group offset starts
        # at its end (a group renamed, or its offsets expired: offsets.retention.minutes).
        return self.cfg.start == "earliest"

    async def _ends(self, consumer: AIOKafkaConsumer) -> dict[tuple[str, int], int]:
        """The end of every partition of the topics this source reads that exist now."""
        try:
            # one timeout for the whole: topics() alone would wait aiokafka's own 40 s request timeout
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                existing = await consumer.topics()
                pattern = self.cfg.pattern
                if pattern is not None:
                    matches = re.compile(pattern).match  # as aiokafka matches a subscription's pattern
                    names = [t for t in existing if matches(t)]
                else:
                    names = [t for t in self.cfg.topic_names if t in existing]
                parts = [TopicPartition(t, p) for t in names for p in consumer.partitions_for_topic(t) or ()]
                ends = await consumer.end_offsets(parts) if parts else {}
        except TimeoutError:
            raise SourceUnavailable(
                f"kafka reading the topics' ends: no answer in {COMMIT_TIMEOUT_S:.0f} s"
            ) from None
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}

    async def assigned(self, parts: list[TopicPartition]) -> None:
        """Start each partition at the checkpoint when there is one (the group's committed offset,
        else ``start``, otherwise); the next read checks it against the broker before using a record.
        Nothing is awaited here: the consumer fetches for the new assignment meanwhile."""
        for tp in parts:
            ours = self.next.get((tp.topic, tp.partition))
            if ours is not None:
                self.consumer.seek(tp, ours)  # type: ignore[union-attr]
        self.unchecked.update(parts)
        log.info(
            "kafka_assigned", source=self.id, partitions=sorted(f"{t.topic}:{t.partition}" for t in parts)
        )

    async def _probe(self) -> None:
        """After an empty read, now and then: is the broker there at all? aiokafka's fetches wait for
        a broker that is down without a word, and the pipeline must say ``degraded`` instead."""
        now = time.monotonic()
        if now - self.probed < IDLE_PROBE_S:
            return
        self.probed = now
        try:
            async with asyncio.timeout(PROBE_S):
                await self.consumer.topics()  # type: ignore[union-attr]
        except TimeoutError:
            raise SourceUnavailable(
                f"kafka broker {self.cfg.brokers}: no answer for {PROBE_S:g} s to a metadata request: "
                "the connection is given up"
            ) from None
        except KafkaError as exc:
            raise SourceUnavailable(f"kafka broker {self.cfg.brokers}: {exc}") from None

    async def _start_at_the_edge(self, tp: TopicPartition) -> None:
        """A partition with neither a checkpoint nor a group offset starts at ``start`` (for
        ``latest``, see the module). (The consumer resets nothing by itself: an offset the log no
        longer has must halt, not jump.)"""
        assert self.consumer is not None
        ours = self.next.get((tp.topic, tp.partition))
        if ours is not None:  # the fetcher asked before the assignment's seek
            self.consumer.seek(tp, ours)
        elif (edge := (self.edges or {}).get((tp.topic, tp.partition))) is not None:
            # start: latest, a partition there at the first start; kept with the checkpoints from
            # now on, so that a restart does not take it for one made since
            self.consumer.seek(tp, edge)
            self.next[(tp.topic, tp.partition)] = edge
        else:
            if self.cfg.start == "latest":
                log.info(
                    "kafka_new_partition_read_from_its_start",
                    source=self.id,
                    partition=f"{tp.topic}:{tp.partition}",
                )
            await self.consumer.seek_to_beginning(tp)

    async def _check(self, got: dict[TopicPartition, list[Any]]) -> None:
        """Newly assigned partitions, before any of their records is used: a checkpoint offset the
        log no longer has is a lost position; a group offset further than the checkpoint (another
        member delivered those records meanwhile) wins, and records fetched before it are dropped."""
        consumer = self.consumer
        assert consumer is not None
        parts = [tp for tp in self.unchecked if tp in consumer.assignment()]
        self.unchecked.clear()
        if not parts:
            return
        commit: dict[TopicPartition, int | None] = {}
        try:
            first = await consumer.beginning_offsets(parts)
            for tp in parts:
                key = (tp.topic, tp.partition)
                ours = self.next.get(key)
                if ours is not None and ours < first[tp]:
                    raise PositionLost(
                        f"topic {tp.topic} partition {tp.partition}: the checkpoint is at offset {ours}, the "
                        f"log now begins at {first[tp]} (retention removed records never delivered)"
                    )
                group = await consumer.committed(tp)
                if group is not None and (ours is None or group > ours):
                    consumer.seek(tp, group)
                    self.next[key] = group
                    got[tp] = [m for m in got.get(tp, []) if m.offset >= group]
                elif self.durable is not None and (held := self.durable.next_offsets().get(key)) != group:
                    # what the sinks held before this member got the partition, confirmed while it
                    # had none: commit it now rather than at the next delivery
                    commit[tp] = held
            await self._commit({tp: o for tp, o in commit.items() if o is not None})
        except KafkaError as exc:
            raise _failure(exc, "checking assigned partitions") from None

    async def revoked(self, parts: list[TopicPartition]) -> None:
        """Commit what the sinks hold of the partitions going away, and nothing beyond it."""
        if self.durable is not None and parts:
            held = self.durable.next_offsets()
            await self._commit({tp: held[(tp.topic, tp.partition)] for tp in parts
                                if (tp.topic, tp.partition) in held})  # fmt: skip
        log.info(
            "kafka_revoked", source=self.id, partitions=sorted(f"{t.topic}:{t.partition}" for t in parts)
        )

    async def read(self) -> list[Event]:
        consumer = self.consumer
        assert consumer is not None, "read before open"
        try:
            got = await consumer.getmany(timeout_ms=self.cfg.poll_ms, max_records=self.cfg.max_records)
        except NoOffsetForPartitionError as exc:
            await self._start_at_the_edge(exc.args[0])
            return []
        except OffsetOutOfRangeError as exc:
            raise PositionLost(f"kafka offsets no longer in the log: {exc}") from None
        except KafkaError as exc:
            raise _failure(exc, "fetching records") from None
        if self.unchecked:
            await self._check(got)
        if not got:
            await self._probe()
        events: list[Event] = []
        count = 0
        for tp, batch in got.items():
            if not batch:
                continue
            count += len(batch)
            key = (tp.topic, tp.partition)
            if key not in self.next:
                self.next[key] = batch[0].offset
            entries: list[Offset] = sorted((t, p, o) for (t, p), o in self.next.items())
            i = entries.index((tp.topic, tp.partition, self.next[key]))
            for m in batch:
                entries[i] = (tp.topic, tp.partition, m.offset + 1)
                cp = KafkaPosition(tuple(entries), (tp.topic, tp.partition, m.offset))
                rec = Record(tp.topic, tp.partition, m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                events.append(await self._event(rec, cp))
            self.next[key] = entries[i][2]
        self.full = count >= self.cfg.max_records
        return events

    async def _event(self, rec: Record, cp: KafkaPosition) -> Event:
        try:
            ev = self.records.event(rec, cp)
        except Malformed as exc:
            reason = f"malformed record at {rec.where}: not a {self.cfg.format} record: {exc}"
            if self.dead_letters is None:
                raise MalformedRecord(
                    f"{reason} (spec.journal.enabled: true sends such records to the dead-letter queue)"
                ) from None
            await self.dead_letters(self.records.raw(rec, cp), reason)
            ev = None
        if ev is None:  # a tombstone or a dead letter: no change, but the offset moves past it
            return new_event("h", None, None, SourceInfo(self.connector, "", rec.topic, cp, 0), "heartbeat",
                             True, f"{rec.topic}:{rec.partition}:{rec.offset}", cp.order, cp, self.tenant, 0)  # fmt: skip
        return ev

    async def confirm(self, checkpoint: Position) -> None:
        """Commit to the group what every sink holds, for the partitions this member owns."""
        held = own_position(checkpoint, KafkaPosition)
        if held is None or self.consumer is None:
            return
        self.durable = held
        owned = self.consumer.assignment()
        await self._commit({tp: o for t, p, o in held.offsets
                            if (tp := TopicPartition(t, p)) in owned and self.committed.get((t, p)) != o})  # fmt: skip

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not offsets or self.consumer is None:
            return
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                await self.consumer.commit(offsets)
        except TimeoutError:
            # aiokafka waits for a broker that is down without a word: say so, the supervisor
            # opens the source again (with backoff) until the broker answers; /health degraded.
            raise SourceUnavailable(
                f"kafka committing offsets: no answer in {COMMIT_TIMEOUT_S:.0f} s"
            ) from None
        except (CommitFailedError, IllegalStateError, RebalanceInProgressError) as exc:
            # A rebalance took the partitions meanwhile: the next owner starts at the last commit,
            # which is behind this one, so nothing is skipped; a later confirm commits again.
            log.info("kafka_commit_skipped", source=self.id, reason=f"{type(exc).__name__}: {exc}")
            return
        except KafkaError as exc:
            raise _failure(exc, "committing offsets") from None
        self.committed.update({(tp.topic, tp.partition): o for tp, o in offsets.items()})

    async def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):  # leaving the group needs the broker
                    await consumer.stop()
            except TimeoutError:
                log.info("kafka_close_timed_out", source=self.id)
            except asyncio.CancelledError:
                # aiokafka's stop() lets the cancellation of its own fetch task escape when a fetch
                # was failing (broker down); only a cancellation of this task itself goes on.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                log.info("kafka_close_cancelled_inside_aiokafka", source=self.id)

    @staticmethod
    def load_position(doc: PositionDoc) -> KafkaPosition:
        return KafkaPosition.from_doc(doc)

    @property
    def idle_wait(self) -> float:
        return 0.0  # a read already waited up to poll_ms for records

    def caught_up(self) -> bool:
        return not self.full
