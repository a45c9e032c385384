"""SparkTransformer: runs each batch through the pipeline's processors on Spark."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from typing import TYPE_CHECKING, Any

from actors import Actor, ActorRef
from deltaforge.metrics import StageTimers
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import Barrier, Batch, DeliverBatch, JobDone
from deltaforge.pipeline.runningtimer import RunningTimer
from deltaforge.transform.plan import Plan, ProcessorError, Transformed
from deltaforge.transform.rowtypes import table_schema
from deltaforge.transform.session import SparkRuntime, SparkUnavailable, runtime_for
from supervision import Fatal

if TYPE_CHECKING:
    from deltaforge.pipeline.coordinator import DeliveryCoordinator

MAX_WAITING_BATCHES = 64  # bounds memory when batches are tiny
UNANSWERED_S = 30.0
"""A job running this long lists ``transform`` as unavailable until it answers (a JVM stopped,
swapped out or in a garbage collector's spiral holds every batch meanwhile)."""


class SparkSessionLost(Exception):
    """The Spark JVM died under a job; the restart starts a new session."""


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


class SparkTransformer(Actor):
    """Sits between the Accumulator and the DeliveryCoordinator when processors exist.

    On start it makes sure the process's Spark session is up (starting it the
    first time, replacing it if its JVM died) and analyses every processor
    against the schemas of the captured tables: a bad one is a :class:`Fatal`
    error naming the processor, before any event flows.

    Up to ``batch.max_inflight`` jobs run at once, in the runtime's thread
    pool, and batches are handed on strictly in arrival order. A failed job
    crashes this actor; the pipeline's supervisor restarts it with the reader,
    which resumes from the committed checkpoints, so the batch is read and
    transformed again and no checkpoint ever moves past an untransformed batch.
    """

    mailbox_size = 4

    def __init__(self, ctx: PipelineContext, coordinator: ActorRef[DeliveryCoordinator]) -> None:
        super().__init__()
        self.ctx = ctx
        self.coordinator = coordinator
        self.timer = StageTimers(ctx.config.name).transform
        self.inflight = max(1, ctx.config.batch.max_inflight)
        self.job_events = ctx.config.spark.max_job_events
        self.waiting: collections.deque[Batch] = collections.deque()
        self.waiting_events = 0
        self.running: collections.deque[tuple[list[Batch], asyncio.Future[Transformed]]] = collections.deque()
        self.runtime: SparkRuntime | None = None
        self.plan: Plan | None = None
        self.unanswered: set[asyncio.Future[Transformed]] = set()
        """Jobs running longer than ``UNANSWERED_S``: ``transform`` is listed unavailable meanwhile."""

    async def on_start(self) -> None:
        cfg = self.ctx.config
        try:
            runtime = runtime_for(cfg.spark, cfg.name)
        except SparkUnavailable as exc:
            raise Fatal(str(exc)) from None
        runtime.users += 1
        self.runtime = runtime
        declared = await self.ctx.source.describe_tables()
        schemas = [table_schema(t, self.ctx.source.connector) for t in declared]
        plan = Plan(cfg.processors, schemas)
        starts = runtime.starts
        began = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(runtime.pool, runtime.ensure)
            await loop.run_in_executor(runtime.pool, plan.analyse, runtime)
        except SparkUnavailable as exc:
            raise Fatal(str(exc)) from None
        stats = self.ctx.stats
        stats.spark_session_starts += runtime.starts - starts
        if runtime.starts != starts:
            self.log.info(
                "spark_session_started",
                master=cfg.spark.master,
                seconds=round(time.monotonic() - began, 2),
                jvm_pid=runtime.jvm_pid(),
                starts=runtime.starts,
            )
        self.log.info(
            "processors_checked",
            processors=[p.path for p in cfg.processors],
            tables=[f"{s.db}.{s.table}" for s in schemas],
        )
        self.plan = plan

    async def on_stop(self) -> None:
        for _, job in self.running:
            job.cancel()
        if self.unanswered:  # the next incarnation's jobs say it again if the JVM still does not answer
            self.unanswered.clear()
            self.ctx.availability.up("transform")
        if self.runtime is not None:
            self.runtime.users -= 1

    async def receive(self, message: Any) -> Any:
        if isinstance(message, DeliverBatch):
            self.waiting.append(message.batch)
            self.waiting_events += len(message.batch.events)
            await self._forward_ready()
            self._pump()
            # Enough waiting for a full job: hold the accumulator (and so the reader) until a job ends.
            while self.waiting_events >= self.job_events or len(self.waiting) >= MAX_WAITING_BATCHES:
                await self._forward_head()
                self._pump()
            return None
        if isinstance(message, JobDone):
            await self._forward_ready()
            self._pump()
            return None
        if isinstance(message, Barrier):
            while self.running or self.waiting:
                self._pump()
                await self._forward_head()
            return True
        return await super().receive(message)

    def _pump(self) -> None:
        """Start jobs while fewer than ``max_inflight`` run; batches that queued meanwhile share one.

        Spark's cost is mostly per job (~40-50 ms of JVM time here, whatever its
        size), so under a backlog several batches go as one job of up to
        ``spark.max_job_events`` events and are split again afterwards: batches,
        their checkpoints and the order they are handed on in do not change. For
        the same reason a job starts beside a running one only with a full job's
        worth of events; fewer wait for the running job and join the next one
        (2k-event batches, inflight 2: 38k -> 46-50k events/s).
        """
        assert self.runtime is not None and self.plan is not None
        loop = asyncio.get_running_loop()
        while self.waiting and len(self.running) < self.inflight:
            if self.running and self.waiting_events < self.job_events:
                break  # not a full job: wait for the running one
            group = [self.waiting.popleft()]
            size = len(group[0].events)
            while self.waiting and size + len(self.waiting[0].events) <= self.job_events:
                size += len(self.waiting[0].events)
                group.append(self.waiting.popleft())
            self.waiting_events -= size
            events = group[0].events if len(group) == 1 else [e for b in group for e in b.events]
            job = loop.run_in_executor(self.runtime.pool, self.plan.run, self.runtime, events)
            timer = RunningTimer(loop, UNANSWERED_S, self._unanswered, job)
            job.add_done_callback(functools.partial(self._answered, timer=timer))
            job.add_done_callback(self._wake)
            self.running.append((group, job))
            stats = self.ctx.stats
            stats.transform_jobs += 1
            stats.transform_most_inflight = max(stats.transform_most_inflight, len(self.running))

    def _unanswered(self, job: asyncio.Future[Transformed]) -> None:
        """A job still running after ``UNANSWERED_S``: every batch waits for it, so the pipeline is
        degraded, not running, until it answers (a failure is the restart's to handle)."""
        self.unanswered.add(job)
        reason = f"a Spark job unanswered for {UNANSWERED_S:g} s (is the JVM stopped, or out of memory?)"
        self.ctx.availability.down("transform", reason)

    def _answered(self, job: asyncio.Future[Transformed], *, timer: RunningTimer) -> None:
        timer.cancel()
        if job in self.unanswered:
            self.unanswered.discard(job)
            if not self.unanswered:
                self.ctx.availability.up("transform")

    def _wake(self, _: asyncio.Future[Transformed]) -> None:
        # A full mailbox means messages are queued, and each of them forwards what is ready.
        try:
            self.ref.try_tell(JobDone())
        except Exception:  # noqa: BLE001 - the actor is gone or busy; either way nobody is waiting
            pass

    async def _forward_ready(self) -> None:
        while self.running and self.running[0][1].done():
            await self._forward_head()

    async def _forward_head(self) -> None:
        group, job = self.running[0]
        first = group[0]
        try:
            result = await job
        except ProcessorError:
            raise
        except Exception as exc:
            self.ctx.stats.transform_failures += 1
            runtime = self.runtime
            assert runtime is not None
            if not await asyncio.to_thread(runtime.alive):
                # What py4j raises when the JVM dies mid-job rarely says so.
                self.log.error("spark_session_lost", batch=first.id, error=_short(exc))
                raise SparkSessionLost(f"Spark session lost (its JVM is gone): {_short(exc)}") from exc
            self.log.error("transform_failed", batch=first.id, error=_short(exc))
            raise
        self.running.popleft()
        stats = self.ctx.stats
        stats.transform_last_ms = round(result.seconds * 1000, 2)
        self.timer.observe(result.seconds)
        parts = [result.events] if len(group) == 1 else result.split([len(b.events) for b in group])
        for batch, events in zip(group, parts, strict=True):
            stats.transform_batches += 1
            stats.transform_events_in += len(batch.events)
            stats.transform_events_out += len(events)
            out = Batch(batch.id, events, sum(e.size for e in events), last=batch.end, epoch=batch.epoch)
            await self.coordinator.tell(DeliverBatch(out))
