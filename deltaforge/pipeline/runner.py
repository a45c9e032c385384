"""PipelineRunner: builds one pipeline's tree, runs it, drains it, reports its state."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import structlog

from actors import ActorStopped, AskTimeout, NodeSnapshot
from deltaforge.config import PipelineConfig
from deltaforge.events import Event
from deltaforge.pipeline import stored
from deltaforge.pipeline.availability import Availability
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.dlq import DeadLetterQueue
from deltaforge.pipeline.messages import (
    ReleaseHeld,
    ResumeReading,
    StopReading,
    TakeSnapshot,
)
from deltaforge.pipeline.owner import claim_source_id
from deltaforge.pipeline.replay import replay
from deltaforge.pipeline.runlock import RunLock
from deltaforge.pipeline.sinkids import check_sinks, deployment_of
from deltaforge.pipeline.stored import StoredCheckpoint
from deltaforge.pipeline.storewait import PatientWrites, refused_write
from deltaforge.pipeline.tree import build_tree, workload_child
from deltaforge.plugins import build_sink, build_source
from deltaforge.sinks.base import PoisonEvent, Sink
from deltaforge.sources.base import Source
from deltaforge.sources.turso.workload import DemoWorkload
from deltaforge.state.checkpoints import CheckpointStore, open_store
from deltaforge.state.deadletters import Select
from supervision import Clock, Fatal, FunctionChild, MonotonicClock, SupervisorFailed, Unavailable

T = TypeVar("T")

READ_GRACE_S = 5.0
"""How long a drain waits for the reader's read in progress to end before it delivers what the
reader handed on without it (a read is a chunk: it ends in well under a second while its
source answers)."""


class BadState(Exception):
    """An operation the pipeline's state does not allow (pause a stopped pipeline, say)."""


class NotNow(Exception):
    """What the pipeline cannot do while its source is down (a snapshot needs the server to
    find its tables): ask again once it is back. Nothing was started."""


class PipelineRunner:
    """Runs one pipeline until it is drained, stopped, or fails.

    ``state`` is ``starting``, ``running``, ``draining``, ``stopped`` or
    ``failed`` (then ``failure`` says why: a Fatal reason such as a lost
    position, or the escalation that exceeded restart intensity).
    """

    def __init__(
        self,
        config: PipelineConfig,
        store: CheckpointStore | None = None,
        sinks: dict[str, Sink[Any]] | None = None,
        workload: DemoWorkload | None = None,
        source: Source | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``clock`` and ``rng`` drive every backoff and retry delay (tests pass a FakeClock)."""
        self.config = config
        self.name = config.name
        self._own_store = store is None
        self.store = store or open_store(config.storage.type, config.storage.path)
        self.sinks = sinks or {s.id: build_sink(s) for s in config.sinks}
        deployment = deployment_of(config.source)
        for sink in self.sinks.values():
            sink.pipeline, sink.deployment = config.name, deployment
        self.source = source or build_source(config.source, config.tenant)
        self.source.scope = f"{socket.gethostname()}:{Path(config.storage.path).absolute()}:{config.name}"
        # Only for Kafka: its sink's thread is a serial chain per batch that the envelopes shorten.
        # With a file sink the decoder child making them cost more than serve saved (two cores).
        self.source.native_envelopes = any(s.envelope == "native" and s.type == "kafka" for s in config.sinks)
        self.workload = workload
        self.ctx = PipelineContext(
            config,
            self.store,
            self.source,
            self.sinks,
            clock=clock or MonotonicClock(),
            rng=rng or random.Random(),
            availability=Availability(config.name),
        )
        self.ctx.dlq = DeadLetterQueue(
            config.name,
            config.journal,
            self.store.dead_letters,
            self.ctx.availability,
            PatientWrites(self.ctx),
        )
        if config.journal.enabled:
            self.source.dead_letters = self._source_dead_letter
        extra = [workload_child(FunctionChild("DemoWorkload", self._run_workload))] if workload else []
        self.tree = build_tree(self.ctx, extra)
        self.supervisor = self.tree.supervisor
        self.state = "starting"
        self._stop_asked = False
        self._opening: asyncio.Task[None] | None = None
        """The store's opening, or the wait for the run lock: a stop cancels it."""
        self._run_lock: RunLock | None = None
        self._replaying = asyncio.Lock()
        self.failure: str | None = None
        self.log = structlog.get_logger().bind(pipeline=self.name)

    async def _source_dead_letter(self, event: Event, reason: str) -> None:
        """A record the source cannot read, kept in the DLQ as the source read it."""
        assert self.ctx.dlq is not None
        await self.ctx.dlq.put(f"source:{self.source.id}", event, PoisonEvent(reason, "invalid_record"), 1)

    async def run(self) -> None:
        """Run until stopped; never raises for a pipeline failure (see ``state``). Every way out,
        a stop before the store opened included, ends with one ``pipeline_stopped`` event."""
        structlog.contextvars.bind_contextvars(pipeline=self.name)
        try:
            await self._run()
        finally:
            self.log.info("pipeline_stopped", state=self.state, reason=self.failure)

    async def _run(self) -> None:
        assert self.ctx.dlq is not None
        try:
            if self._own_store and not await self._open_store():
                self.state = "stopped"  # asked to stop while the store's disk refused writes
                return
            self.ctx.dlq.entries = await self.store.dead_letters.count(self.name)
            clash = (
                await claim_source_id(self.store, self.source.id, self.config, PatientWrites(self.ctx))
                if self._own_store
                else None
            )
        except Exception as exc:  # what retrying cannot mend (see _open_store)
            storage = self.config.storage
            self.log.error("store_open_failed", storage=storage.type, path=storage.path, exc_info=True)
            self._failed(f"spec.storage: cannot open the {storage.type} store at {storage.path}: {exc}")
            return
        if clash is None and not self._stop_asked and not await self._hold_run_lock():
            self._stop_asked = True  # asked to stop while another process ran the pipeline
        if clash is None and not self._stop_asked and self._own_store:
            clash = await check_sinks(
                self.store, self.config, self.ctx.key, PatientWrites(self.ctx), self.log
            )
        if self._stop_asked or clash is not None:
            self.state = "stopped"
            if clash is not None:
                self._failed(clash)
            await self._let_go()
            return
        self.state = "running"
        self.log.info("pipeline_started", source=self.config.source.id, sinks=list(self.sinks))
        try:
            await self.supervisor.run()
            self.state = "stopped"
        except Fatal as exc:
            self._failed(exc.reason)
        except SupervisorFailed as exc:
            self._failed(str(exc))
        finally:
            await self._let_go()

    async def _let_go(self) -> None:
        """The store closed, then the run lock released: the next holder finds every write made."""
        if self._own_store:
            await self.store.close()
        if self._run_lock is not None:
            self._run_lock.release()

    async def _hold_run_lock(self) -> bool:
        """Hold this pipeline's run lock on its store (``runlock.py``), waiting while another
        process holds it: ``degraded``, ``run_lock`` listed with the holder, checked every
        ``runlock.LOOK_S``. False if stopped first. A store in memory, or one a test passed in,
        is this process's own: no lock."""
        storage = self.config.storage
        if not self._own_store or storage.type == "memory":
            return True
        lock = RunLock(storage.path, self.name)
        if not await self._until_stopped(lock.wait(self.ctx.availability, self.ctx.clock, self.log)):
            return False
        self._run_lock = lock
        return True

    async def _open_store(self) -> bool:
        """Open the store; False if stopped first. A disk that refuses writes (a full disk at start)
        is waited for as the store's writes are (``storewait.py``): ``degraded``, ``state_store``
        listed with the error. A drain or stop ends the wait."""
        return await self._until_stopped(PatientWrites(self.ctx, refused_write)(self.store.open))

    async def _until_stopped(self, wait: Coroutine[Any, Any, None]) -> bool:
        """Run ``wait`` as a task a drain or stop cancels; False if it did."""
        opening = asyncio.create_task(wait)
        self._opening = opening
        try:
            await opening
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._stop_asked or (task is not None and task.cancelling()):
                raise
            return False
        finally:
            self._opening = None
        return True

    def _failed(self, reason: str) -> None:
        self.state = "failed"
        self.failure = reason
        self.log.error("pipeline_failed", reason=reason)

    async def pause(self) -> None:
        """Stop reading; the source stays open, what was read is still delivered."""
        if self.state != "running":
            raise BadState(f"pipeline {self.name!r} is {self.state}, not running")
        self.ctx.paused = True
        await self._tell_reader(StopReading())
        self.state = "paused"
        self.log.info("pipeline_paused")

    async def resume(self) -> None:
        """Read again after :meth:`pause`."""
        if self.state != "paused":
            raise BadState(f"pipeline {self.name!r} is {self.state}, not paused")
        self.ctx.paused = False
        await self._tell_reader(ResumeReading())
        self.state = "running"
        self.log.info("pipeline_resumed")

    async def _tell_reader(self, message: StopReading | ResumeReading) -> None:
        """Pause or resume reading. A reader that is down (its source is, and it waits for its next
        restart) or still opening its source takes ``ctx.paused`` as it starts: pausing a degraded
        pipeline used to fail (ActorStopped, a 500 over REST), which is when an operator pauses."""
        try:
            await self.tree.reader.ask(message, timeout=30)
        except (ActorStopped, AskTimeout):
            self.log.info("reader_told_at_start", message=type(message).__name__)

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop reading, deliver and checkpoint what is buffered, then stop the tree."""
        if self.state not in ("running", "paused"):
            self._stop_asked = True  # before run() got going: it must not start the tree at all
            self.supervisor.request_stop()
            if self._opening is not None:
                self._opening.cancel()
            return
        self.state = "draining"
        self.ctx.draining = True
        tree = self.tree
        try:
            async with asyncio.timeout(timeout):
                # A reader opening its source, or in a read the source does not answer (a
                # snapshot chunk from a server alive but answering nothing), answers only once the
                # source does, and held the drain its whole timeout. What it handed on before is
                # delivered; what it reads now is not (the stop ends the read; the next start
                # reads it again). Once open it reads nothing more (ctx.draining); its
                # StopReading, queued, stops it after the read.
                stopped = not self.ctx.opening and await self._reader_answers(StopReading())
                await tree.deliver_buffered(timeout)
                if stopped:
                    await tree.reader.ask(ReleaseHeld(), timeout=timeout)
            last = self.ctx.stats.last_checkpoint
            self.log.info("pipeline_drained", checkpoint=last.to_doc() if last else None)
        except ActorStopped as exc:
            # Between two attempts the restarted actors are down; what they held, uncheckpointed, is read again.
            self.log.info("pipeline_drain_skipped", reason=f"{exc}: the pipeline is between two attempts; "
                          "the next start reads on from the last checkpoint")  # fmt: skip
        except TimeoutError as exc:
            self.log.warning("pipeline_drain_incomplete", reason=str(exc))
        self.supervisor.request_stop()

    async def _reader_answers(self, message: StopReading) -> bool:
        """Whether the reader answers ``message`` within :data:`READ_GRACE_S` (a read in
        progress ends first), said when it does not."""
        try:
            await self.tree.reader.ask(message, timeout=READ_GRACE_S)
        except AskTimeout:
            self.log.info(
                "drain_without_reader",
                reason=f"the reader's read did not end within {READ_GRACE_S:g} s (its source answers "
                "nothing): what it handed on is delivered; the next start reads the rest again",
            )
            return False
        return True

    def stop_now(self) -> None:
        """Stop the tree without delivering what is buffered (a drain that waits on a sink that is
        down can be cut short this way): nothing is lost, the checkpoints of the batches already
        delivered are written on the way out (if the store answers within a few seconds), and the
        next start reads the rest again."""
        self._stop_asked = True
        self.supervisor.request_stop()
        if self._opening is not None:
            self._opening.cancel()

    async def _run_workload(self) -> None:
        assert self.workload is not None
        wl = self.workload
        wl.start()
        try:
            while wl.is_alive():
                await asyncio.sleep(0.1)
            if wl.error is not None:
                raise RuntimeError(f"demo workload failed: {wl.error}")
        finally:
            await asyncio.to_thread(wl.stop)

    def snapshot(self) -> NodeSnapshot:
        return self.supervisor.snapshot()

    @property
    def degraded(self) -> bool:
        """Running (or starting), but waiting for a source, a sink or the store's disk."""
        return self.state in ("starting", "running") and self.ctx.availability.degraded

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "degraded": self.degraded,
            "unavailable": self.ctx.availability.view(),
            "failure": self.failure,
            "source": {"type": self.config.source.type, "id": self.config.source.id},
            "sinks": [{"type": s.type, "id": s.id, "required": s.required} for s in self.config.sinks],
            "commit_policy": {
                "mode": self.config.commit_policy.mode,
                "quorum": self.config.commit_policy.quorum,
            },
            "counters": self.ctx.stats.to_dict(),
            "snapshot": self.ctx.snapshot.to_dict(),
        }

    async def take_snapshot(self, tables: list[str], by: str = "api") -> dict[str, Any]:
        """Snapshot ``tables`` while streaming goes on (the reader takes it up between reads)."""
        if self.state not in ("running", "paused"):
            raise BadState(f"pipeline {self.name!r} is {self.state}, not running")
        try:
            reply = await self.tree.reader.ask(TakeSnapshot(tuple(tables), by), timeout=60)
        except (ActorStopped, AskTimeout, Unavailable) as exc:
            # The reader is down waiting for its source, still opening it, or lost it while
            # finding the tables: the request is not taken (it used to be a 500).
            down = self.ctx.availability.view().get("source")
            why = down["last_error"] if down is not None else f"{type(exc).__name__}: {exc}"
            raise NotNow(
                f"pipeline {self.name!r} cannot take a snapshot now: its source is unavailable "
                f"({why}); nothing was started, ask again once the source is back"
            ) from None
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def identity(self) -> dict[str, Any]:
        """The identity of the source's server as last reconciled (FailoverReconciler)."""
        return {"source": self.config.source.id, "identity": self.ctx.identity}

    async def reconcile_records(self) -> list[dict[str, Any]]:
        """What each reconciliation found (failovers, lost positions), oldest first."""
        return list(self.ctx.reconcile_records)

    def _read_store(self, work: Callable[[CheckpointStore], Awaitable[T]]) -> Awaitable[T]:
        """``work`` on the store, open or closed (:func:`stored.read_on`)."""
        return stored.read_on(self.store, self.config.storage if self._own_store else None, work)

    async def schemas(self) -> dict[str, Any]:
        """Each captured table's current schema: its latest recorded version."""
        source_id = self.config.source.id
        return {
            "source": source_id,
            "tables": await self._read_store(lambda s: stored.latest_schemas(s, source_id)),
        }

    async def schema_versions(self, table: str) -> list[dict[str, Any]]:
        """Every schema recorded for ``table``, oldest first, each from the source position it began at."""
        return await self._read_store(lambda s: stored.schema_versions(s, self.config.source.id, table))

    async def forget_checkpoints(self) -> None:
        """What :func:`stored.forget` forgets: a pipeline created again under this name starts over."""
        await self._read_store(lambda s: stored.forget(s, self.config.source.id, list(self.sinks)))

    async def replay_dead_letters(self, which: Select) -> int:
        """Deliver the chosen dead letters again, sink by sink in seq order; each is acked (gone) only
        once its sink holds it. Raises :class:`ReplayFailed` saying why when a sink refuses."""
        async with self._replaying:  # a replay sent twice at once would deliver each entry twice
            assert self.ctx.dlq is not None
            return await replay(self.ctx.dlq, self.tree.workers, which)

    async def checkpoints(self) -> dict[str, StoredCheckpoint | None]:
        """Current per-sink checkpoints with their versions."""
        return await stored.checkpoints(self.store, self.config.source.id, list(self.sinks))
