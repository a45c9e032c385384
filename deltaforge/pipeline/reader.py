"""SourceReader: reads chunks from the source, from the minimum sink checkpoint."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from actors import Actor, ActorRef
from deltaforge.metrics import StageTimers, observe_lag
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import (
    EventsRead,
    ReadNext,
    ReleaseHeld,
    ResumeReading,
    Rewind,
    StopReading,
    TakeSnapshot,
)
from deltaforge.pipeline.reconciler import Reconcile
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.position import Position, earliest
from deltaforge.snapshot.chunks import SnapshotRefused
from deltaforge.snapshot.driver import SnapshotDriver
from deltaforge.sources.base import PositionLost, Source
from deltaforge.state.checkpoints import sink_key
from supervision import Unavailable

SETTLE_S = 30.0
"""How long an error that ends a reading waits for what was read before it to be delivered."""

if TYPE_CHECKING:
    from deltaforge.pipeline.accumulator import Accumulator
    from deltaforge.pipeline.reconciler import FailoverReconciler


class SourceReader(Actor):
    """Pulls chunks from the :class:`Source` and tells them to the Accumulator.

    It resumes from the *minimum* checkpoint across sinks, so a sink that is
    behind gets what it is missing (sinks ahead of it skip what they have). A
    sink with no checkpoint yet means: from the beginning. The tell into the
    Accumulator waits while its mailbox is full — that is where a slow sink
    finally slows the database reads.

    It starts last: every actor downstream (and the SparkTransformer, which checks
    the processors) is up before the first read.

    Each opening of the source starts a new *epoch*, carried by its chunks: on a
    :class:`Rewind` (a lagging sink is back) it opens the source again from the
    minimum durable checkpoint, and the coordinator lets that sink rejoin at the
    first batch of the new epoch — no gap, and the other sinks skip what they hold.

    Snapshots run inside its reads (:class:`SnapshotDriver`): chunks are selected between
    watermarks in the same stream, so a snapshot row and a change of that row reach sinks
    in the order they happened.
    """

    mailbox_size = 2

    def __init__(
        self,
        ctx: PipelineContext,
        accumulator: ActorRef[Accumulator],
        reconciler: ActorRef[FailoverReconciler] | None = None,
        settle: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.patient = PatientWrites(ctx)
        self.accumulator = accumulator
        self.reconciler = reconciler
        self.settle = settle
        """Delivers everything handed downstream (see :meth:`_deliver_what_was_read`)."""
        self.timers = StageTimers(ctx.config.name)
        self.schemas: dict[str, list[dict[str, Any]] | None] = {}  # table -> its latest recorded columns
        self.reading = True
        self._read_queued = False  # a ReadNext of ours waits in the mailbox
        self.confirmed: Position | None = None
        self.epoch = 0
        self.told_caught_up = True  # what the Accumulator was told last of the source
        self.snapshots = SnapshotDriver(ctx, self.log)

    async def on_start(self) -> None:
        ctx = self.ctx
        self.snapshots.log = self.log  # bound to this actor's name now
        ctx.opening = True
        try:
            found = await ctx.load_checkpoints()
            ctx.durable.clear()
            ctx.durable.update(found)
            await self._open()
        finally:
            ctx.opening = False
        # A pipeline paused before this (re)start stays paused: only a resume reads again; one
        # whose drain began meanwhile reads nothing more.
        self.reading = not (ctx.paused or ctx.draining)
        self._read_again()

    def _read_again(self) -> None:
        """Queue the next read, unless one is queued or reading is stopped. Never waits for room:
        only this actor empties its mailbox, so waiting on it from in here waited for ever (a
        lagging sink's Rewind and a pause's StopReading, come during one read, filled both
        places). A full mailbox holds messages, and the handling of each calls this again."""
        if self.reading and not self._read_queued:
            self._read_queued = self.ref.try_tell(ReadNext())

    async def _open(self) -> None:
        ctx = self.ctx
        joined = ctx.newcomers()
        resume = ctx.resume_point(from_held=self.snapshots.copies_rows or not ctx.source.starts_at_oldest)
        ctx.epoch += 1
        self.epoch = ctx.epoch
        self.confirmed = None
        self.log.info(
            "source_opening",
            source=ctx.source.id,
            resume_after=resume.to_doc() if resume else None,
            epoch=self.epoch,
        )
        if joined:
            self.log.info("sinks_without_checkpoint", sinks=joined, snapshot=self.snapshots.copies_rows)
        await self.snapshots.before_open(resume)
        source = ctx.source
        source.remembered = await ctx.store.get(_memo_key(source))
        try:
            try:
                if self.reconciler is not None:
                    # No timeout: the reconciler bounds what it asks the server, and its
                    # store writes wait out a full disk.
                    outcome = await self.reconciler.ask(Reconcile(resume), timeout=None)
                    if isinstance(outcome, Exception):
                        raise outcome
                await source.open(resume)
                await self.snapshots.opened(resume, joined=bool(joined) and self.snapshots.copies_rows)
            except PositionLost as lost:
                if await self._spare(lost):
                    await self._open()  # without them
                    return
                await self._resnapshot_or_halt(lost)
        except Unavailable as exc:
            ctx.availability.down("source", exc)  # the supervisor retries with backoff
            raise
        await self._remember()

    async def _reopen(self) -> None:
        await self.snapshots.close()
        await self.ctx.source.close()
        await self._open()

    async def _remember(self) -> None:
        """Store what the source's next opening compares with, when it changed."""
        source = self.ctx.source
        memo = source.memo()
        if memo is not None and memo != source.remembered:
            await self.patient(lambda: self.ctx.store.put(_memo_key(source), memo))
            source.remembered = memo

    async def _deliver_what_was_read(self) -> None:
        """Before an error that ends this reading (a damaged event, a lost position): what came
        before it is delivered and checkpointed, so a halt leaves the checkpoints right before
        what failed. A restart would otherwise drop the batches in flight, and the next reading
        could fail again before they go out. A sink that does not take them within SETTLE_S is
        not waited for longer: the error goes up all the same."""
        if self.settle is None:
            return
        try:
            await self.settle(SETTLE_S)
        except Exception as exc:  # noqa: BLE001 - the source's error is the one raised
            self.log.warning("delivery_before_error_incomplete", reason=f"{type(exc).__name__}: {exc}")

    async def _spare(self, lost: PositionLost) -> bool:
        """The position is lost only for optional sinks behind the others (one down long enough
        for the server to drop what it had not taken: a purged binlog): the sinks they are
        optional to must not stop for them. So the source opens again from the others'
        checkpoints, and each is named (``sink_position_lost``) and, with a snapshot mode that
        copies rows, given a snapshot as a sink added is; under ``never`` it is parked for this
        run (nothing is delivered to it). True when some were; False: the position is lost for
        sinks that are needed (the commit policy ``required`` only: under ``all`` or a quorum
        every sink counts)."""
        ctx = self.ctx
        if ctx.config.commit_policy.mode != "required":
            return False
        required = {s.id: s.required for s in ctx.config.sinks}
        held = ctx.held()
        needed = [cp for s, cp in held.items() if required.get(s, True)]
        if not needed:
            return False
        floor = earliest(needed)
        behind = sorted(
            s for s, cp in held.items()
            if not required.get(s, True) and earliest([floor, cp]).to_doc() != floor.to_doc()
        )  # fmt: skip
        if not behind:
            return False
        copies = self.snapshots.spared = self.snapshots.copies_rows
        for sink_id in behind:
            if copies:
                del ctx.durable[sink_id]  # a sink without a checkpoint: given a snapshot as one added
            else:
                ctx.parked[sink_id] = str(lost)
                ctx.stats.sinks[sink_id].lagging = True
        self.log.error(
            "sink_position_lost", sinks=behind, reason=str(lost), action="snapshot" if copies else "parked",
            detail="the source no longer has what these optional sinks had not taken; the other sinks go on "
            + ("and these are given a snapshot of the tables, as a sink added is" if copies else
               "and these take nothing more until they are copied again: set snapshot.mode to initial (or "
               "when_needed) to give them a snapshot at the next start"),
        )  # fmt: skip
        return True

    async def _resnapshot_or_halt(self, lost: PositionLost) -> None:
        """``snapshot.mode: when_needed`` reads from now and snapshots again; otherwise, halt. The
        sinks whose checkpoints alone were lost (behind the others: taken out of the pipeline for
        a while and put back, say) are named first: the source's reason names only its log."""
        held = self.ctx.held()
        if len(held) > 1:
            floor = earliest(held.values()).to_doc()
            behind = sorted(
                s for s in held if earliest([cp for o, cp in held.items() if o != s]).to_doc() != floor
            )  # fmt: skip
            if behind:
                keys = " ".join(sink_key(self.ctx.source.id, b) for b in behind)
                self.log.error(
                    "position_lost_at_sinks", sinks=behind,
                    reason=f"{lost}; the others hold positions still on the server: `deltaforge checkpoints "
                    f"--forget {keys}` makes these sinks new, given a snapshot at the next start under "
                    "snapshot.mode initial or when_needed while the others go on",
                )  # fmt: skip
        if not self.snapshots.recovers:
            raise lost
        await self.snapshots.recover(lost)

    async def _record_schema(self, table: str, columns: list[dict[str, Any]], position: Position) -> None:
        """A new version of ``table``'s schema, unless its columns are those of the latest one: a
        source announces every table again after each reconnect. What a column change calls for
        (``columns_changed``) comes first: should it fail (a server that went down), the version
        is not recorded, and the next announcement after the reconnect calls for it again."""
        store, source_id = self.ctx.store, self.ctx.source.id
        if table not in self.schemas:
            history = await store.schema_history(source_id, table)
            self.schemas[table] = history[-1]["columns"] if history else None
        was = self.schemas[table]
        if was == columns:
            return
        if was is not None:
            await self.snapshots.columns.changed(table, was, columns)
        # Tried until the store takes it (a full disk: degraded meanwhile, see storewait).
        await self.patient(lambda: store.record_schema(source_id, table, columns, position.to_doc()))
        self.schemas[table] = columns
        self.log.info(
            "schema_recorded", table=table, columns=[c["name"] for c in columns], position=position.to_doc()
        )

    async def receive(self, message: Any) -> Any:
        answer = await self._receive(message)
        self._read_again()
        return answer

    async def _receive(self, message: Any) -> Any:
        if isinstance(message, ReadNext):
            self._read_queued = False
            if not self.reading:
                return None
            source = self.ctx.source
            try:
                durable = self.ctx.durable_min()
                if durable is not None and durable is not self.confirmed:
                    await source.confirm(durable)
                    await self.snapshots.confirm(durable)
                    self.confirmed = durable
                started = time.perf_counter()
                try:
                    events = await self.snapshots.read()
                except PositionLost as lost:
                    # As at an opening: MariaDB says a purged binlog at the first read, once its
                    # dump starts, when the purge came after the opening's own check of it.
                    if await self._spare(lost):
                        await self._reopen()  # without them
                    else:
                        await self._resnapshot_or_halt(lost)
                    events = []
                # A column change may ask the server for a snapshot: down, it is unavailable too.
                for table, columns, position in source.take_schema_changes():
                    await self._record_schema(table, columns, position)
                if rewritten := source.take_rewritten():
                    for fact in rewritten:
                        await self.snapshots.columns.rewritten(fact)
                    await self._remember()  # told: the next opening does not find them again
            except Unavailable as exc:
                self.ctx.stats.source_errors += 1
                self.ctx.availability.down("source", exc)
                raise
            except Exception:
                self.ctx.stats.source_errors += 1
                await self._deliver_what_was_read()
                raise
            self.ctx.availability.up("source")
            if events:
                stats = self.ctx.stats
                stats.events_read += len(events)
                stats.bytes_read += sum(e.size for e in events)
                self.timers.read.observe(time.perf_counter() - started)  # waiting for the source included
                last = events[-1]
                if last.op != "h":
                    observe_lag(self.timers.pipeline, source.id, f"{last.source.db}.{last.source.table}",
                                last.source.ts_ms)  # fmt: skip
                self.told_caught_up = self.snapshots.caught_up()
                await self.accumulator.tell(EventsRead(events, self.epoch, self.told_caught_up))
            elif not self.told_caught_up and self.snapshots.caught_up():
                # More was said to be coming and none of it was ours (PostgreSQL: a transaction of
                # another application's logical messages): the batch held for it goes now, not
                # at max_ms or with the next heartbeat.
                self.told_caught_up = True
                await self.accumulator.tell(EventsRead([], self.epoch, True))
            else:
                await anyio.sleep(self.ctx.source.idle_wait)  # polling pace, not a retry: real time
            return None
        if isinstance(message, Rewind):
            if self.reading:
                await self._reopen()
            return None
        if isinstance(message, TakeSnapshot):
            try:
                await self.snapshots.request(list(message.tables), message.by)
            except SnapshotRefused as exc:
                return exc
            return self.ctx.snapshot.to_dict()
        if isinstance(message, ReleaseHeld):
            durable = self.ctx.durable_min()
            if durable is not None:  # even if confirmed: the source may not have been able to act on it
                try:
                    with anyio.move_on_after(5):  # a server that is down must not hold the drain
                        await self.ctx.source.confirm(durable)
                        self.confirmed = durable
                except Exception as exc:  # noqa: BLE001 - stopping anyway; the next start confirms again
                    self.log.info("source_confirm_failed", reason=f"{type(exc).__name__}: {exc}")
            return True
        if isinstance(message, StopReading):
            self.reading = False
            return True
        if isinstance(message, ResumeReading):
            self.reading = True  # the source stayed open: go on where reading stopped
            return True
        return await super().receive(message)

    async def on_stop(self) -> None:
        await self.snapshots.close()
        await self.ctx.source.close()


def _memo_key(source: Source) -> str:
    """Where the source's memo is kept beside the checkpoints."""
    return f"{source.id}::memo"
