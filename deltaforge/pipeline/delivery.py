"""DeliveryWorker: one per sink; delivers batches with retries and reports the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import structlog

from actors import Actor
from deltaforge.events import Event
from deltaforge.metrics import END_TO_END_SECONDS, SINK_SECONDS
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.heldends import HeldEnds, held_key
from deltaforge.pipeline.messages import (
    Batch,
    BatchDelivered,
    DeliverTo,
    DeliveryFailed,
    ProbeSink,
    ReplayDeadLetters,
)
from deltaforge.pipeline.policy import needed
from deltaforge.pipeline.runningtimer import RunningTimer
from deltaforge.position import Position, advance, not_held
from deltaforge.sinks.base import NonRetryableSinkError, PoisonEvent, RetryableSinkError, Sink, SinkError
from deltaforge.state.checkpoints import set_back_key
from supervision import Backoff, Fatal

RETRY = Backoff(base=0.1, max=10.0)
UNANSWERED_S = 30.0
"""A delivery that has not returned after this long lists its sink as unavailable: a sink that
retries inside one call (Kafka's transaction commit, for up to a minute) or waits on a dead
connection cannot deliver, and ``/health`` must not say ok meanwhile."""
ATTEMPTS = 3


class DeliveryWorker(Actor):
    """Owns one sink: skips what the sink already has, delivers, retries.

    On start it loads the sink's own checkpoint; events at or before it are
    skipped (this is how a sink ahead of the source's resume point avoids
    duplicates). Retryable errors are retried ``ATTEMPTS`` times with
    exponential backoff and jitter, then reported as :class:`DeliveryFailed`
    (the coordinator retries the batch with backoff for as long as it takes) and
    the connection is dropped so the next attempt opens a fresh one; meanwhile
    the sink is listed as unavailable (``/health``: degraded). Non-retryable
    errors are reported at once; :class:`Fatal` and unexpected errors crash the
    worker, for its supervisor to judge. A sink that is down is not a crash.
    """

    mailbox_size = 1

    def __init__(self, ctx: PipelineContext, sink_id: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.sink_id = sink_id
        self.sink: Sink[Any] = ctx.sinks[sink_id]
        self.stats = ctx.stats.sinks[sink_id]
        self.latency = SINK_SECONDS.labels(ctx.config.name, sink_id)
        self.end_to_end = END_TO_END_SECONDS.labels(ctx.config.name, sink_id)
        self.position: Position | None = None
        self.held = HeldEnds(ctx.store, held_key(ctx.source.id, sink_id), self.sink, ctx.source.load_position)
        required = next(s.required for s in ctx.config.sinks if s.id == sink_id)
        self.needed = needed(ctx.config.commit_policy, required)
        """Whether the commit policy waits for this sink: only then does an error of its library that
        is no :class:`SinkError` crash this worker (see :meth:`_sink_call`)."""

    async def on_start(self) -> None:
        doc = await self.ctx.store.get(self.ctx.key(self.sink_id))
        self.position = self.ctx.source.load_position(doc) if doc is not None else None
        await self.held.load()
        self.opened = False
        self.checked = False
        """The sink's own record of what it holds set back (a note) or adopted since it opened."""
        self.recheck = False
        """A sink that records its position failed a batch: read the record again before the retry
        (the sink may have started over on a new connection, to a server that lost it)."""
        # The sink connects on the first batch, not here: a worker is "up" once it can take
        # batches, so a sink that is down does not hold back the start of the pipeline (its
        # first batch fails instead, and the coordinator retries it). One whose client connects
        # in the background starts to now (prepare never waits).
        self._loop = asyncio.get_running_loop()
        self._watch: RunningTimer | None = None
        """The watch of the delivery under way (see :meth:`_watched`), cancelled once it returns."""
        self.sink.unreachable = self._heard_unreachable
        await self.sink.prepare()

    async def _open(self) -> None:
        if not self.opened:
            await self.sink.open()
            self.opened = True
            self.checked = False
        if not self.checked:  # until this succeeds: a retry finds the sink open, and must not skip it
            if not await self._rewound() and self.sink.records_position:
                await self._adopt_sink_position()
            self.checked = True

    async def _rewound(self) -> bool:
        """Whether this sink's checkpoint was set back by hand (``deltaforge checkpoints
        --rollback`` / ``--forget``) since the sink last opened: then what the sink keeps of its own
        is set back too (:meth:`Sink.rewind`), before anything is delivered, and its position
        record is not adopted (it would undo the rollback). The note goes once that is done; a
        crash in between sets it back again, which is exact: nothing was delivered meanwhile."""
        key = set_back_key(self.ctx.source.id, self.sink_id)
        note = await self.ctx.store.get(key)
        if note is None:
            return False
        await self.sink.rewind(self.position)
        await self.ctx.store.delete_keys([key])
        self.log.warning(
            "sink_record_rewound", sink=self.sink_id, how=note.get("how"),
            to=self.position.to_doc() if self.position else None,
            reason="its checkpoint was set back by hand: what comes again from there is delivered again",
        )  # fmt: skip
        return True

    async def _adopt_sink_position(self) -> None:
        """What the sink itself recorded wins when it is further than the local checkpoint: a crash
        between the sink's commit and the checkpoint write left the checkpoint behind."""
        doc = await self.sink.stored_position()
        stored = self.ctx.source.load_position(doc) if doc is not None else None
        self._check_record(stored)
        if stored is None:
            return
        ahead = advance(self.position, stored)
        if ahead is not self.position:
            self.log.info(
                "sink_position_ahead", sink=self.sink_id, sink_holds=doc,
                checkpoint=self.position.to_doc() if self.position else None,
            )  # fmt: skip
            self.position = ahead

    def _check_record(self, stored: Position | None) -> None:
        """A record behind what the sink acknowledged earlier in this run: its server lost
        committed data (a Kafka topic made again, a broker that kept nothing), with the records
        of those batches. Said, as Redis and NATS sinks say it (``sinks/acknowledged.py``); what
        was lost is not sent again (the checkpoint is past it)."""
        given = self.sink.acknowledged
        if given is None or (stored is not None and advance(stored, given) == stored):
            return
        self.sink.lost_acknowledged += 1
        self.log.error(
            "sink_lost_acknowledged", sink=self.sink_id, where="the sink's position record",
            acknowledged=given.to_doc(), now_ends_at=stored.to_doc() if stored is not None else None,
            reason="the server no longer has the position record (and so the batches) it acknowledged: "
            "it lost them, or they were deleted. deltaforge does not send them again (its checkpoint is "
            "past them): snapshot the tables they came from again",
        )  # fmt: skip
        self.sink.acknowledged = stored

    async def _reconnect(self) -> None:
        """Drop the connection after a failed batch: the next attempt opens a fresh one."""
        if self.opened:
            self.opened = False
            try:
                await self.sink.close()
            except Exception as exc:  # noqa: BLE001 - the connection is broken; closing is best effort
                self.log.info("sink_close_failed", sink=self.sink_id, reason=f"{type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def _sink_call(self) -> Iterator[None]:
        """Around each call into the sink: a cancellation its library made is retried as a lost
        connection (:func:`_library_cancel`); an error of its library that is no
        :class:`SinkError` (a case no one classified, such as the stdout sink's BrokenPipeError
        before it was) crashes this worker when the commit policy needs the sink, for its
        supervisor to judge: restarts, then the pipeline failed. A sink the policy does not wait
        for is retried instead, each such error logged with its traceback (``sink_raised``): it
        lags and catches up, and its restarts no longer count against the pipeline's intensity,
        which they used to exhaust, failing the pipeline for a sink it does not need."""
        with _library_cancel(self.sink_id, self.log):
            try:
                yield
            except (SinkError, Fatal):
                raise
            except Exception as exc:
                if self.needed:
                    raise
                why = f"{type(exc).__name__}: {exc}"
                self.log.warning("sink_raised", sink=self.sink_id, reason=why, exc_info=True)
                raise RetryableSinkError(f"sink {self.sink_id!r}: {why}") from exc

    async def on_stop(self) -> None:
        await self.held.save(now=True)
        await self.sink.close()

    def _pending(self, batch: Batch) -> list[Event]:
        return not_held(self.position, _data(batch.events))

    async def _isolate(self, events: list[Event], end: Position) -> None:
        """Deliver ``events`` around their poison ones, in order, by halves: what fails alone is
        poison. Each delivered part moves this worker's position, so a retry after a connection
        error skips it. A part records its own last position (a sink that keeps positions with
        the data must never hold one past what it holds); ``end`` is the batch's."""
        try:
            await self._deliver(events, end)
        except PoisonEvent as exc:
            if len(events) == 1:
                await self._poisoned(events[0], exc)
            else:
                half = len(events) // 2
                await self._isolate(events[:half], events[half - 1].checkpoint)
                await self._isolate(events[half:], end)
                return
        self.position = end

    async def _watched(self, events: list[Event], end: Position) -> None:
        """Deliver (around poison events), listing the sink as unavailable if that has not
        returned after ``UNANSWERED_S``; whatever it raises is raised as itself.

        The watch is a timer, not a task: a task cancelled after every batch left its
        CancelledError, traceback and frames in a reference cycle each time, which only the cyclic
        collector frees, in pauses of 13-37 ms every few seconds at 5k rows/s."""
        # Real time: a fake clock's sleeps are the tests' backoffs.
        self._watch = timer = RunningTimer(self._loop, UNANSWERED_S, self._unanswered)
        try:
            try:
                await self._deliver(events, end)
            except PoisonEvent:
                await self._isolate(events, end)
        finally:
            timer.cancel()

    async def _deliver(self, events: list[Event], end: Position) -> None:
        await self.sink.deliver(events, end)
        if self.sink.records_position:
            self.sink.acknowledged = advance(self.sink.acknowledged, end)

    def _heard_unreachable(self, why: str) -> None:
        """The sink's :attr:`Sink.unreachable`, called from the sink's thread."""
        self._loop.call_soon_threadsafe(self._unreachable, why)

    def _unreachable(self, why: str) -> None:
        """The sink's library reaches no server while a delivery waits: listed now, where the
        delivery's own error may be a long timeout away. A report arriving after the delivery
        ended (its watch cancelled) is of no delivery: the next one says for itself. librdkafka
        says it again at each reconnection that fails: once is enough (an outage's ``attempts``
        count deliveries)."""
        what = f"sink:{self.sink_id}"
        watch = self._watch
        if watch is not None and not watch.cancelled() and not self.ctx.availability.listed(what):
            self.ctx.availability.down(what, f"delivery waiting: no server reachable (still trying{why})")

    def _unanswered(self) -> None:
        self.ctx.availability.down(
            f"sink:{self.sink_id}",
            f"delivery unanswered for {UNANSWERED_S:g} s (still trying{self.sink.waiting_on()})",
        )

    async def _poisoned(self, event: Event, error: PoisonEvent) -> None:
        """To the DLQ, or (journal off) the failure that halts, naming the event."""
        dlq = self.ctx.dlq
        if dlq is None or not dlq.enabled:
            s = event.source
            raise NonRetryableSinkError(
                f"{error}; poison event {event.event_id} of {s.db}.{s.table} at {s.position.to_doc()} "
                "(spec.journal.enabled: true sends such events to the dead-letter queue)"
            )
        await dlq.put(self.sink_id, event, error, attempts=1)
        self.stats.dead_letters += 1

    async def replay(self, events: list[Event]) -> None:
        """Dead letters again, as they were (their idempotency keys too): no position recorded."""
        await self._open()
        await self.sink.deliver_dead_letters(events)

    async def _probe(self) -> str | None:
        """Whether the sink answers now: None if so, else why not."""
        try:
            with self._sink_call():
                await self._open()
                await self.sink.reachable()
        except SinkError as exc:
            await self._reconnect()
            return str(exc)
        self.ctx.availability.up(f"sink:{self.sink_id}")
        return None

    async def receive(self, message: Any) -> Any:
        if isinstance(message, ProbeSink):
            return await self._probe()
        if isinstance(message, ReplayDeadLetters):
            try:
                with self._sink_call():
                    await self.replay(list(message.events))
            except SinkError as exc:
                return str(exc)
            return None
        if not isinstance(message, DeliverTo):
            return await super().receive(message)
        batch = message.batch
        if self.sink.records_position and not self.opened:
            try:
                with self._sink_call():
                    await self._open()  # its own position decides what is pending
            except SinkError:
                pass  # the attempts below open again, and report
        data = _data(batch.events)
        events = not_held(self.position, data)
        self.stats.skipped += len(data) - len(events)  # held already; heartbeats are not events
        started = time.perf_counter()
        if events:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    with self._sink_call():
                        await self._open()
                        if self.recheck:
                            await self._adopt_sink_position()
                            self.recheck = False
                        events = self._pending(batch)
                        if events:
                            await self._watched(events, batch.checkpoint)
                    break
                except Fatal:
                    raise
                except SinkError as exc:
                    self.recheck = self.sink.records_position
                    self.stats.errors += 1
                    kind = "retryable" if exc.retryable else "non_retryable"
                    self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
                    self.stats.last_error = str(exc)
                    if exc.retryable:
                        self.ctx.availability.down(f"sink:{self.sink_id}", exc)
                    if not exc.retryable or attempt == ATTEMPTS:
                        await self._reconnect()
                        self.log.warning(
                            "delivery_failed",
                            sink=self.sink_id,
                            batch=batch.id,
                            reason=str(exc),
                            attempts=attempt,
                        )
                        return DeliveryFailed(self.sink_id, batch.id, str(exc), exc.retryable)
                    self.stats.retries += 1
                    await self.ctx.clock.sleep(RETRY.delay(attempt, self.ctx.rng))
        self.ctx.availability.up(f"sink:{self.sink_id}")
        self.position = advance(self.position, batch.checkpoint)
        if events:
            self.latency.observe(time.perf_counter() - started)
            if (oldest := events[0].source.ts_ms) > 0:
                self.end_to_end.observe(max(0.0, time.time() - oldest / 1000))
        self.stats.events += len(events)
        self.stats.bytes += sum(e.size for e in events)
        self.stats.batches += 1
        # transactional sinks count their own commits and aborts
        self.stats.txn_commits = int(getattr(self.sink, "commits", 0))
        self.stats.txn_aborts = int(getattr(self.sink, "aborts", 0))
        self.stats.lost_acknowledged = self.sink.lost_acknowledged
        await self.held.save()
        assert self.position is not None
        return BatchDelivered(self.sink_id, batch.id, self.position, len(events))


@contextlib.contextmanager
def _library_cancel(sink_id: str, log: structlog.stdlib.BoundLogger) -> Iterator[None]:
    """A ``CancelledError`` out of a sink's call while this worker is not being cancelled is its
    client library's own: a wait the library cancelled (seen once with nats-py while a NATS
    cluster lost its stream's leader, chaos ``nats_leader_loss`` seed 313; which call, its log did
    not say). Retried as a lost connection (the sink degraded, then back). Left to rise, it
    crashed the worker: a restart, and the batch's retry held back until it. Logged with its stack
    (``sink_wait_cancelled``): where the library cancels is not known yet."""
    try:
        yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # ours: the worker is being stopped
        log.warning("sink_wait_cancelled", sink=sink_id, reason="retried as a connection lost", exc_info=True)
        raise RetryableSinkError(
            f"sink {sink_id!r}: a wait inside its client library was cancelled (retried as a connection lost)"
        ) from None


def _data(events: list[Event]) -> list[Event]:
    """The events a sink is given: heartbeats move checkpoints, sinks never see them."""
    if any(e.op == "h" for e in events):
        return [e for e in events if e.op != "h"]
    return events
