"""Kafka sink (confluent-kafka): idempotent producer, or one Kafka transaction per batch.

The producer is librdkafka, blocking on flush and on transaction calls, so it
lives in this sink's own worker thread and never blocks the event loop.

* Default — at-least-once: ``enable.idempotence`` dedups the producer's own
  retries; a crash replay can still duplicate (consumers dedup on the
  ``idempotency_key`` header).
* ``exactly_once: true`` — each batch is one transaction with a stable
  ``transactional.id`` (``deltaforge-<pipeline>-<sink>``): read_committed
  consumers see a batch whole or not at all. A fenced producer is
  :class:`supervision.Fatal`: another instance took over, the pipeline stops.

Records' keys, tombstones and primary-key moves: :mod:`deltaforge.sinks.kafka_records`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from actors import Begun, BlockingRunner
from deltaforge.configmodel import SinkConfig
from deltaforge.envelopes import encoder
from deltaforge.events import Event
from deltaforge.position import Position, PositionDoc
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, Sink, SinkError
from deltaforge.sinks.durability import KafkaTopics
from deltaforge.sinks.kafka_ends import PartitionEnds
from deltaforge.sinks.kafka_errors import POISON, Reports, classify, resumed
from deltaforge.sinks.kafka_metadata import ask, learn
from deltaforge.sinks.kafka_names import topic_renderer
from deltaforge.sinks.kafka_offsets import position_record, read_position
from deltaforge.sinks.kafka_queue import discard, drop_unsent, queue
from deltaforge.sinks.kafka_records import MESSAGE_MAX_BYTES, RecordMaker, check_sizes
from deltaforge.sinks.kafka_settings import (
    KafkaSinkConfig,
    ProducerValue,
    connection_settings,
    producer_settings,
)
from deltaforge.sinks.templates import compile_template
from supervision import Fatal

_ABORT_WAIT_S = 5.0
"""How long an abort may take before the producer is given up (a healthy broker takes milliseconds)."""
COMMIT_RETRY_S = 60.0
"""How long at least a commit in doubt (failed retriably: it may have succeeded) is asked again."""
Ahead = tuple[PositionDoc | None] | None
"""The position record as read ahead (in a 1-tuple: the record may be absent), or not read."""


class KafkaSink(Sink[KafkaSinkConfig]):
    """Produces each event to a topic named by a template (``cdc.${source.table}``)."""

    def __init__(self, config: SinkConfig[KafkaSinkConfig]) -> None:
        super().__init__(config)
        cfg = self.settings
        self.brokers = cfg.brokers
        self.exactly_once = cfg.exactly_once
        self.timeout = cfg.timeout_s
        self.extra: dict[str, ProducerValue] = dict(cfg.producer)
        self.max_bytes = int(self.extra.get("message.max.bytes", MESSAGE_MAX_BYTES))
        self.records_of = RecordMaker(
            topic_renderer(cfg.topic, self.id),
            encoder(config.envelope),
            compile_template(cfg.key) if cfg.key else None,
            cfg.tombstones,
        )
        self._producer: Producer | None = None
        self._thread = BlockingRunner(1)
        self._opening: Begun[tuple[Producer, Ahead]] | None = None
        """exactly_once: the producer being made since :meth:`prepare`, for :meth:`open` to take."""
        self._ahead: Ahead = None
        """exactly_once: the position record as read right after that producer's init, for the
        first :meth:`stored_position` (nothing else writes it then: the init fenced the rest)."""
        self._learned: set[str] = set()
        """Topics the current producer was asked the metadata of (see kafka_metadata.learn)."""
        self._own_topics = {cfg.offsets_topic} if self.exactly_once else set()
        self.commits = 0
        self._committed: bytes | None = None
        """exactly_once: the position record of this sink's last commit, while nothing failed since."""
        self.aborts = 0
        self._reopened = False
        self.ends = PartitionEnds(self.id, self.timeout)
        # a lost connection, in the default mode: were the partitions' ends kept?
        self.heard = Reports(
            None if self.exactly_once else self.ends.disturb, lambda why: self.unreachable(why)
        )
        self._topics = KafkaTopics(self.id, min(self.timeout, 10.0), self.ends.admin)  # one admin client
        self.acked_ends = None if self.exactly_once else self.ends.acked
        # exactly_once: the position record kept between runs is compared only in the same topic
        self.target = f"{self.brokers} {cfg.offsets_topic}" if self.exactly_once else self.brokers
        self.reach = connection_settings(cfg)
        """What the sink's other clients (reading back its position, its partitions' ends) connect with."""

    @property
    def transactional_id(self) -> str:
        return f"deltaforge-{self.pipeline}-{self.id}"

    async def prepare(self) -> None:
        """The producer, begun now, so that the broker's connection, metadata and producer id
        are under way while the source reads. The default mode's is made here: librdkafka
        connects in its own threads, so making it waits for nothing. An exactly_once producer's
        ``init_transactions`` does wait: it runs in a thread of its own, followed by the read
        back of the position record, and the first batch's :meth:`open` and
        :meth:`stored_position` take them (a restart's first event: docs/performance.md)."""
        if self.exactly_once:
            if self._opening is None and self._producer is None:
                self._opening = Begun(self._open_ahead)
            return
        with contextlib.suppress(SinkError):
            await self.open()  # refused settings: the first batch's open says so

    async def open(self) -> None:
        opening, self._opening = self._opening, None
        if opening is not None:
            # Failed (the broker away then, say): made again just below, which says why if it
            # still cannot be, rather than failing the batch with what was true at the start.
            with contextlib.suppress(SinkError):
                self._producer, self._ahead = await opening.result()
                self._learned = set()
        if self._producer is None:  # prepared, or a batch since: the producer stays
            await self._thread.run(self._open)

    def _open(self) -> None:
        self._producer = self._made()
        self._learned = set()

    def _open_ahead(self) -> tuple[Producer, Ahead]:
        producer = self._made()
        try:
            ahead: Ahead = (
                read_position(self.reach, self.settings.offsets_topic, self.position_key, self.timeout),
            )
        except SinkError:
            ahead = None  # read again by stored_position, which says why if it still fails
        return producer, ahead

    def _made(self) -> Producer:
        conf = producer_settings(self.settings, f"deltaforge-{self.pipeline}-{self.id}")
        self.ends.conf = {**self.reach, "client.id": conf["client.id"]}
        conf["error_cb"] = self.heard.hear
        if self.exactly_once:
            conf["transactional.id"] = self.transactional_id
            # An open transaction that outlives this is aborted by the broker with an epoch bump,
            # which fences the producer: give outages room (15 min, brokers' default maximum).
            conf.setdefault("transaction.timeout.ms", 900_000)
        try:
            producer = Producer(conf)
        except KafkaException as exc:  # a setting librdkafka refuses (producer:): no retry fixes it
            raise NonRetryableSinkError(
                f"kafka sink {self.id!r}: producer settings: {exc.args[0].str()}"
            ) from None
        if self.exactly_once:
            try:
                # A named broker's connection up first: without it init_transactions took 500 ms
                # longer in 5 of 22 restarts (librdkafka's id-request timer, as in learn, by its
                # length; not seen in its logs)
                ask(producer, None, self.timeout)
                resumed(producer, producer.init_transactions, self.timeout)
            except KafkaException as exc:
                producer.poll(0)  # serves the reports of why (error_cb) queued meanwhile
                raise self._classify(exc.args[0]) from None
        return producer

    async def reachable(self) -> None:
        if self._producer is None:
            await self.open()
        await self._thread.run(self._metadata)

    def _metadata(self) -> None:
        """A metadata round trip: librdkafka connects lazily, so a new producer proves nothing."""
        assert self._producer is not None
        try:
            self._producer.list_topics(timeout=min(self.timeout, 10.0))
        except KafkaException as exc:
            self._producer.poll(0)  # as in _made
            raise RetryableSinkError(f"kafka sink {self.id!r}: {exc.args[0]}{self.heard.said()}") from None

    async def close(self) -> None:
        self._reopened = True  # a fence right after the next init is our own old epoch's, once
        self._committed = None
        opening, self._opening = self._opening, None
        self._ahead = None
        if opening is not None:
            # Waited for, not left running: its init, finishing after a new producer's, would fence it
            with contextlib.suppress(Exception):
                made, _ = await opening.result()
                await self._thread.run(discard, made)
        producer, self._producer = self._producer, None
        if producer is not None:
            await self._thread.run(discard, producer)

    def waiting_on(self) -> str:
        return self.heard.said()

    @property
    def records_position(self) -> bool:  # type: ignore[override]
        return self.exactly_once

    @property
    def position_key(self) -> bytes:
        return f"{self.pipeline}/{self.id}".encode()

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        try:
            if self._producer is None:
                await self.open()
            await self._thread.run(self._deliver, events, position)
        except BaseException:
            self.ends.disturb()  # the retry may find a broker that came back without its data
            raise

    async def stored_position(self) -> PositionDoc | None:
        """exactly_once: the position recorded in the offsets topic by the last committed batch."""
        if not self.exactly_once:
            return None
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            return ahead[0]
        topic = self.settings.offsets_topic
        # In a thread of its own (its own consumer, nothing of the producer's): one a stop leaves
        # waiting on a broker that is away (up to timeout_s) must not hold the process's exit.
        return await Begun(read_position, self.reach, topic, self.position_key, self.timeout).result()

    async def rewind(self, position: Position | None) -> None:
        """exactly_once: the position record set back to ``position`` (a null position: none),
        in a transaction of its own, so that the next start does not take the one before the
        rollback over the checkpoint set back, and skip what the operator asked for again."""
        if not self.exactly_once:
            return
        self._ahead = None  # read before the rewind
        if self._producer is None:
            await self.open()
        await self._thread.run(self._deliver, [], position, True)

    def _deliver(self, events: list[Event], position: Position | None = None, rewind: bool = False) -> None:
        producer = self._producer
        assert producer is not None
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        # Every record's topic, key and value first: an event whose template does not resolve
        # fails the batch before anything of it is sent. Encoding while producing was tried and
        # undone: records before a poison one were already in flight when it was met, and the retry
        # around it sent them twice; measured again (docs/performance.md), it gained nothing.
        records = self.records_of(events)
        check_sizes(records, self.max_bytes, self.id)
        if not self.exactly_once:
            self.lost_acknowledged += self.ends.check()
        held: bytes | None = None
        committed, self._committed = self._committed, None  # known again only once this commits
        try:
            try:
                if self.exactly_once:
                    producer.begin_transaction()
                    if committed is not None and (position is not None or rewind):
                        # The committed record again, first: the offsets topic's partition joins
                        # the transaction with the batch's, a round trip less before the commit
                        # (docs/performance.md). Shown though aborted (Tansu 0.6), it says only
                        # what is committed already.
                        producer.produce(
                            self.settings.offsets_topic, committed, self.position_key, on_delivery=on_delivery
                        )
                queue(producer, records, on_delivery)
                topics = {rec[0] for rec in records}
                # an exactly_once producer's offsets topic too: its position record follows
                learn(producer, topics | self._own_topics, self._learned, self.timeout)
                if self.exactly_once:
                    if position is not None or rewind:
                        # In the same transaction: a read_committed reader (this sink, after a crash)
                        # sees the batch and where it left the source together or not at all. And only
                        # once every record of the batch is acknowledged: a broker that shows aborted
                        # records (Tansu 0.6) could otherwise show a position whose records never landed.
                        if producer.flush(self.timeout) or errors:
                            raise (
                                self._classify(errors[0])
                                if errors
                                else RetryableSinkError(
                                    f"kafka sink {self.id!r}: records not acknowledged in time{self.heard.said()}"
                                )
                            )
                        held = position_record(position)
                        producer.produce(
                            self.settings.offsets_topic, held, self.position_key, on_delivery=on_delivery
                        )
                    self._commit(producer)
                    self._committed = held or committed
                    self.commits += 1
                else:
                    left = producer.flush(self.timeout)
                    if left:
                        # What this producer still holds unsent would go out beside the retry's
                        # copy; and it may be stuck (see _classify): the retry gets a new one.
                        drop_unsent(producer)
                        self._producer = None
                        raise RetryableSinkError(
                            f"kafka sink {self.id!r}: {left} messages not acknowledged in time{self.heard.said()}"
                        )
                if errors:
                    raise self._classify(errors[0])
                self._topics.after_batch(producer, topics)
                self.ends.produced_to(topics)
                self.heard.clear()
            except SystemError as exc:
                # confluent-kafka runs a delivery report while a failing producer call has its
                # exception set, and the report's append fails on it: that call's failure (the
                # fence, say) is chained here. Handle it as itself.
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, KafkaException):
                    raise cause from None
                self._producer = None
                raise RetryableSinkError(f"kafka sink {self.id!r}: {exc} (producer recreated)") from None
        except KafkaException as exc:
            err = exc.args[0]
            self._abort(producer, err)
            if not self.exactly_once:
                # What this batch queued before the failing record is not sent: the batch is tried
                # again (around a poison record, pipeline/delivery.py), so sending it now would
                # only duplicate it.
                drop_unsent(producer)
                if err.code() in POISON:
                    producer.flush(self.timeout)
            raise self._classify(err) from None
        except SinkError:
            self._abort(producer, None)
            raise
        except Fatal:
            raise
        except Exception:
            # A value that cannot be encoded (a bug, not the broker): none of this batch may stay
            # queued, or half of it could be sent now and all of it again on the retry.
            self._abort(producer, None)
            if not self.exactly_once:
                drop_unsent(producer)
            raise

    def _commit(self, producer: Producer) -> None:
        """librdkafka's guidance: a commit that fails retriably (a timeout) is retried, since it
        may have succeeded; aborting then could let the retried batch commit twice. While the
        broker stays away the batch is given up as retryable: the next attempt starts a new
        producer, whose init aborts this transaction if it did not commit, and the offsets
        topic says if it did."""
        deadline = time.monotonic() + max(4 * self.timeout, COMMIT_RETRY_S)
        while True:
            try:
                resumed(producer, producer.commit_transaction, self.timeout)
                self._reopened = False
                return
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable():
                    raise
                if time.monotonic() > deadline:
                    self._producer = None
                    raise RetryableSinkError(
                        f"kafka sink {self.id!r}: commit not confirmed: {err.name()}: {err.str()}"
                    ) from None

    def _abort(self, producer: Producer, err: KafkaError | None) -> None:
        """Abort only what can be aborted: our own failure before the commit, or an error that
        says the transaction must be aborted (never a fatal one: that producer is finished)."""
        if not self.exactly_once or (err is not None and (err.fatal() or not err.txn_requires_abort())):
            return
        try:
            producer.abort_transaction(min(self.timeout, _ABORT_WAIT_S))
            self.aborts += 1
        except KafkaException:
            # Not aborted: the next attempt starts a new producer, whose init fences this one's
            # epoch, and that aborts the transaction. Retrying the abort on this producer cannot
            # help: a broker back without the transaction answers it with an error librdkafka
            # retries until the timeout, and each later abort then fails as "conflicting".
            self._producer = None

    def _classify(self, err: KafkaError) -> Exception:
        """The batch's error for ``err`` (:func:`classify`); a producer that is finished is let go,
        so the retry starts another."""
        verdict = classify(
            err, self.id, self.exactly_once, self._reopened, self.transactional_id, self.heard.said()
        )
        if verdict.forgave_fence:
            self._reopened = False
        if verdict.new_producer:
            self._producer = None
        return verdict.error
