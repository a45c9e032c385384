"""DeliveryCoordinator: fans a batch out to every sink and applies the commit policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from actors import Actor, ActorRef, ActorStopped
from deltaforge.metrics import StageTimers
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import (
    Barrier,
    Batch,
    BatchDelivered,
    CheckpointWritten,
    CommitCheckpoint,
    DeliverBatch,
    DeliverTo,
    DeliveryFailed,
    ProbeLagging,
    ProbeSink,
    Rewind,
    SinksProbed,
)
from deltaforge.pipeline.policy import needed, policy_satisfied
from deltaforge.pipeline.rereading import Rereading
from deltaforge.position import Position
from supervision import Backoff, Fatal

if TYPE_CHECKING:
    from deltaforge.pipeline.committer import CheckpointCommitter
    from deltaforge.pipeline.delivery import DeliveryWorker
    from deltaforge.pipeline.reader import SourceReader

ASK_TIMEOUT = 120.0
STOP_WRITE_S = 5.0
MAX_UNWRITTEN_BATCHES = 64
"""With a write under way, delivery waits once this many batches (or ``batch.max_events`` events)
are delivered and not yet written: a store that hangs holds the pipeline, and what a crash
delivers again stays about one batch."""


class DeliveryAbandoned(Fatal):
    """A sink the commit policy needs failed in a way that retrying cannot fix (bad credentials,
    a missing target, a path naming a folder): the pipeline stops at once, saying which sink and
    why. Restarting its actors would ask the same sink the same thing with the same config, so
    restarts until the intensity ran out only delayed that answer by half a minute of tracebacks;
    ``POST /pipelines/{name}/resume`` (or a new ``serve``) starts it again once fixed."""


@dataclass
class Unwritten:
    """Delivered batches whose checkpoints are not durable yet: the newest checkpoint of each sink
    (a later one supersedes an earlier), and what they add to the committed counters."""

    checkpoints: dict[str, Position] = field(default_factory=dict)
    batches: int = 0
    events: int = 0
    last_batch: int = 0
    last_checkpoint: Position | None = None

    def add(self, batch: Batch, checkpoints: dict[str, Position]) -> None:
        self.checkpoints.update(checkpoints)
        self.batches += 1
        self.events += len(batch.events)
        self.last_batch = batch.id
        self.last_checkpoint = batch.checkpoint


class DeliveryCoordinator(Actor):
    """Delivers each batch to all sinks concurrently, then commits checkpoints.

    Batches are handled one at a time in arrival order (FIFO): no reordering,
    ever, including across retries. A batch is retried — only towards the sinks
    that have not acknowledged it — with exponential backoff until the commit
    policy is satisfied; only then are the acknowledging sinks' checkpoints
    written. A sink that failed a batch the others committed is *lagging*: it
    gets no later batch of this reading (so its checkpoint can never jump over
    the gap). A timer probes it with backoff; once it answers, the reader is told
    to :class:`Rewind` — open the source again from the minimum durable
    checkpoint, which is at or before the lagging sink's — and the sink rejoins at
    the first batch of that new reading. The others skip what they already hold.
    A sink that failed in a way retrying cannot fix stays behind until the next start.

    Checkpoints are written behind delivery: while batch N's are being made
    durable, batch N+1 is already being delivered. One write at a time, in
    batch order; the batches delivered meanwhile go in the next write as one,
    each sink at its newest checkpoint. A batch counts as committed (the
    ``events_committed`` counter, ``last_checkpoint``) only once its write is
    durable, and a :class:`Barrier` waits for the writes too. Delivery no longer
    waits for an fsync between batches (commit-to-sink p99 at 5k rows/s, see
    docs/performance.md); a crash before a write loses nothing, it only means
    those batches are delivered again, as a crash mid-delivery always did.
    """

    def __init__(
        self,
        ctx: PipelineContext,
        workers: dict[str, ActorRef[DeliveryWorker]],
        committer: ActorRef[CheckpointCommitter],
        reader: Callable[[], ActorRef[SourceReader]],
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.workers = workers
        self.committer = committer
        self.reader = reader  # built after this actor: looked up when needed
        self.policy = ctx.config.commit_policy
        self.required = {s.id: s.required for s in ctx.config.sinks}
        self.timers = StageTimers(ctx.config.name)
        sup = ctx.config.supervision
        self.backoff = Backoff(sup.backoff_base_ms / 1000, sup.backoff_max_ms / 1000)
        self.lagging: dict[str, int] = {s: ctx.epoch for s, st in ctx.stats.sinks.items() if st.lagging}
        """Each lagging sink and the reading (epoch) in which it fell behind."""
        self.back: set[str] = set()
        """Lagging sinks that answered a probe: they rejoin at the first batch of a later reading."""
        self.given_up: set[str] = set()
        """Lagging sinks that failed in a way retrying cannot fix: not probed again in this run."""
        self.rejoined: set[str] = set()
        """Sinks that rejoined and have not yet delivered a batch since."""
        self.epoch = ctx.epoch
        self.rewind_due = False
        self.rereading = Rereading()
        self.comebacks_failed = 0  # probes refused, or sinks that failed again right after rejoining
        self.rng = ctx.rng
        self._prober: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self.unwritten = Unwritten()
        self.max_unwritten = ctx.config.batch.max_events
        self.writing: tuple[asyncio.Future[int], Unwritten] | None = None

    async def on_start(self) -> None:
        self._probe_later()

    async def on_stop(self) -> None:
        for task in (self._prober, self._probing):
            if task is not None:
                task.cancel()
        await self._write_on_the_way_out()

    async def _write_on_the_way_out(self) -> None:
        """The checkpoints of batches delivered and not yet written, written as this actor stops
        (a restart, a stop that does not drain), if the committer still takes them: it stops
        after this actor. Then what is delivered again next time is only what was not delivered.
        Bounded, so a store that does not answer cannot hold the stop."""
        if self.writing is None and not self.unwritten.batches:
            return
        with anyio.move_on_after(STOP_WRITE_S) as scope:
            try:
                self._write_next()
                await self._written()
            except Exception as exc:  # noqa: BLE001 - stopping anyway; the next start reads from the store
                self.log.info("checkpoints_not_written_at_stop", reason=f"{type(exc).__name__}: {exc}")
                return
        if scope.cancelled_caught:
            self.log.info("checkpoints_not_written_at_stop", reason=f"no answer in {STOP_WRITE_S:g} s")

    def _unprobed(self) -> set[str]:
        """Lagging sinks not probed: given up, or parked (their position lost; ``ctx.parked``)."""
        return self.given_up | self.ctx.parked.keys()

    def _probe_later(self) -> None:
        """Run the probe timer while some sink is lagging (and not given up)."""
        if (self._prober is None or self._prober.done()) and self.lagging.keys() - self._unprobed():
            self._prober = asyncio.create_task(self._probe_timer())

    async def _probe_timer(self) -> None:
        while self.rewind_due or self.lagging.keys() - self.back - self._unprobed():
            await self.ctx.clock.sleep(self.backoff.delay(min(self.comebacks_failed + 1, 30), self.rng))
            self.ref.try_tell(ProbeLagging())

    def _probe(self) -> None:
        """Probe the lagging sinks in a task of its own, unless one is under way: a probe that
        does not answer (a half-open server, a connect waiting out its timeout) must not hold
        this actor, and with it every other sink's next batch. The answers come back as
        :class:`SinksProbed`."""
        if self._probing is not None and not self._probing.done():
            return
        todo = sorted(self.lagging.keys() - self.back - self._unprobed())
        if todo:
            self._probing = asyncio.create_task(self._ask_probes(todo))
        else:
            self._rewind_if_due()

    async def _ask_probes(self, sinks: list[str]) -> None:
        answers: list[tuple[str, str | None]] = []
        fatal: BaseException | None = None
        for sink_id in sinks:
            try:
                reason = await self.workers[sink_id].ask(ProbeSink(), timeout=ASK_TIMEOUT)
            except Fatal as exc:
                fatal = exc
                break
            except Exception as exc:  # noqa: BLE001 - as in _ask: the worker crashed, or is down between
                # two incarnations (ActorStopped): not back. Raised, it crashed this actor, and with it
                # the whole pipeline, for a sink the commit policy does not wait for.
                reason = f"{type(exc).__name__}: {exc}"
            answers.append((sink_id, reason))
        try:
            await self.ref.tell(SinksProbed(tuple(answers), fatal))
        except ActorStopped:
            pass  # this incarnation is gone; the next one probes again

    def _probed(self, message: SinksProbed) -> None:
        if message.fatal is not None:
            raise message.fatal
        for sink_id, reason in message.answers:
            if reason is None and sink_id in self.lagging:
                self.back.add(sink_id)
                self.rewind_due = True
                self.log.info("sink_back", sink=sink_id)
            elif reason is not None:
                self.comebacks_failed += 1
        self._rewind_if_due()

    def _rewind_if_due(self) -> None:
        # Never wait on the reader: it may itself be waiting for room downstream of here. Not
        # while the last reading asked for holds the others back (rereading.py).
        now = self.ctx.clock.now()
        if self.rewind_due and self.rereading.may_rewind(now) and self.reader().try_tell(Rewind()):
            self.rewind_due = False
            self.rereading.rewound(self.epoch, now)

    def _rejoin(self, batch: Batch) -> None:
        """The first batch of a new reading: sinks that are back and fell behind before it began
        take part again (the reading started at or before their durable checkpoint)."""
        self.epoch = batch.epoch
        self.back -= self.ctx.parked.keys()  # back, but the reading went on without them
        for sink_id in [s for s in self.back if self.lagging[s] < batch.epoch]:
            del self.lagging[sink_id]
            self.back.discard(sink_id)
            self.rejoined.add(sink_id)
            self.ctx.stats.sinks[sink_id].lagging = False
            self.log.info("sink_rejoined", sink=sink_id, batch=batch.id)

    @classmethod
    def mailbox_for(cls, max_inflight: int) -> int:
        return max(1, max_inflight)

    async def receive(self, message: Any) -> Any:
        self._take_write()  # whatever the message: a wake-up dropped on a full mailbox costs nothing
        if isinstance(message, DeliverBatch):
            if message.batch.epoch > self.epoch:
                self._rejoin(message.batch)
            await self._deliver(message.batch)  # a halt's checkpoints are written by on_stop
            self.rereading.delivered(message.batch.epoch, message.batch.checkpoint, self.ctx.clock.now())
            return None
        if isinstance(message, ProbeLagging):
            self._probe()
            return None
        if isinstance(message, SinksProbed):
            self._probed(message)
            return None
        if isinstance(message, CheckpointWritten):
            return None
        if isinstance(message, Barrier):
            await self._written()
            return True
        return await super().receive(message)

    async def _written(self) -> None:
        """Wait until every delivered batch's checkpoints are durable."""
        while self.writing is not None:
            await self._one_written()

    async def _one_written(self) -> None:
        """Wait for the write under way to end (the next one, if any, starts then)."""
        if self.writing is not None:
            await asyncio.wait([self.writing[0]])
            self._take_write()

    def _write_next(self) -> None:
        """Start writing the unwritten checkpoints, unless a write is under way."""
        if self.writing is not None or not self.unwritten.batches:
            return
        todo, self.unwritten = self.unwritten, Unwritten()
        if not todo.checkpoints:  # no sink acknowledged: nothing to store, the batch is done
            self._committed(todo)
            return
        # No timeout: the committer tries a write until the store takes it (degraded meanwhile).
        write = asyncio.ensure_future(
            self.committer.ask(CommitCheckpoint(todo.last_batch, todo.checkpoints), timeout=None)
        )
        write.add_done_callback(self._wake)
        self.writing = (write, todo)

    def _wake(self, write: asyncio.Future[int]) -> None:
        if not write.cancelled():
            write.exception()  # taken by _take_write; this stops asyncio reporting it as never retrieved
        try:
            self.ref.try_tell(CheckpointWritten())
        except ActorStopped:
            pass  # this incarnation is gone; the next one reads from the durable checkpoints

    def _take_write(self) -> None:
        """A write that ended: its batches are committed, or its error crashes this actor (as if it
        had been awaited); then the next write starts."""
        if self.writing is None or not self.writing[0].done():
            return
        write, todo = self.writing
        self.writing = None
        write.result()
        self._committed(todo)
        self._write_next()

    def _committed(self, todo: Unwritten) -> None:
        stats = self.ctx.stats
        stats.batches_committed += todo.batches
        stats.events_committed += todo.events
        stats.last_checkpoint = todo.last_checkpoint
        stats.last_commit_at = time.time()

    async def _deliver(self, batch: Batch) -> None:
        acked: dict[str, BatchDelivered] = {}
        failed: dict[str, str] = {}
        dead: dict[str, str] = {}  # failed in a way retrying cannot fix: not asked again
        attempt = 0
        started = time.perf_counter()
        while True:
            todo = [
                s for s in self.required
                if s not in acked and s not in self.lagging and s not in dead and s not in self.ctx.parked
            ]  # fmt: skip
            results = await asyncio.gather(*(self._ask(s, batch) for s in todo))
            failed = {}
            for sink_id, result in zip(todo, results, strict=True):
                if isinstance(result, BatchDelivered):
                    acked[sink_id] = result
                else:
                    failed[sink_id] = result.reason
                    if not result.retryable and needed(self.policy, self.required[sink_id]):
                        raise DeliveryAbandoned(f"sink {sink_id!r}: {result.reason}")
                    if not result.retryable:
                        dead[sink_id] = result.reason
            if policy_satisfied(self.policy, self.required, set(acked)):
                self.timers.deliver.observe(time.perf_counter() - started)
                break
            if self.policy.mode == "quorum":
                able = [s for s in self.required if s not in dead and s not in self.lagging]
                if len(able) < self.policy.quorum:
                    why = "; ".join(f"sink {s!r}: {r}" for s, r in dead.items())
                    raise DeliveryAbandoned(
                        f"quorum {self.policy.quorum} cannot be met: only {len(able)} sinks can still take "
                        f"batch {batch.id} ({why})"
                    )
            attempt += 1
            self.ctx.stats.commit_failures += 1
            delay = self.backoff.delay(min(attempt, 30), self.rng)
            self.log.warning(
                "commit_policy_unsatisfied",
                batch=batch.id,
                failed=failed,
                retry_in_s=round(delay, 3),
                attempt=attempt,
            )
            await self.ctx.clock.sleep(delay)
        if self.rejoined:
            if self.rejoined & acked.keys():
                self.comebacks_failed = 0
            self.comebacks_failed += len(self.rejoined & (failed.keys() | dead.keys()))
            self.rejoined -= acked.keys() | failed.keys() | dead.keys()
        self.given_up |= dead.keys()
        for sink_id, reason in {**failed, **dead}.items():
            self.lagging[sink_id] = batch.epoch
            self.back.discard(sink_id)
            self.ctx.stats.sinks[sink_id].lagging = True
            self.log.warning("sink_lagging", sink=sink_id, batch=batch.id, reason=reason)
        self._probe_later()
        self.unwritten.add(batch, {self.ctx.key(s): r.checkpoint for s, r in acked.items()})
        self._write_next()
        if self.unwritten.events >= self.max_unwritten or self.unwritten.batches >= MAX_UNWRITTEN_BATCHES:
            await self._one_written()

    async def _ask(self, sink_id: str, batch: Batch) -> BatchDelivered | DeliveryFailed:
        try:
            return await self.workers[sink_id].ask(DeliverTo(batch), timeout=ASK_TIMEOUT)
        except Fatal:
            raise
        except ActorStopped as exc:
            return DeliveryFailed(sink_id, batch.id, str(exc), True)
        except Exception as exc:  # noqa: BLE001 - the worker crashed; its supervisor restarts it
            return DeliveryFailed(sink_id, batch.id, f"{type(exc).__name__}: {exc}", True)
