"""SnapshotDriver: runs snapshots inside the SourceReader's reads (see the package docstring).

The reader owns it: every read first writes windows while a snapshot has chunks to go
and fewer than ``DEPTH`` are pending (low watermark, one chunk per active table, high
watermark), then passes the source's events through :meth:`SnapshotDriver.through`,
which swallows watermarks and signal rows, drops rows a window's changes made stale, and
emits what is left right after its high watermark. Streaming goes on between windows, so
changes are at most one chunk select late.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event, new_event, with_images
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.position import Position, as_int
from deltaforge.snapshot.chunks import ChunkReader, SnapshotRefused
from deltaforge.snapshot.columnchange import ColumnChanges
from deltaforge.snapshot.listed import ListedTables, copyable
from deltaforge.snapshot.progress import ProgressLog, SnapshotState
from deltaforge.snapshot.window import Chunk, TableRef, Window, watch
from deltaforge.sources.base import PositionLost

if TYPE_CHECKING:
    from deltaforge.pipeline.context import PipelineContext


DEPTH = 2
"""Windows in flight at once."""


def resets_key(source_id: str) -> str:
    """Where a source's count of lost positions is kept (``Source.resets``)."""
    return f"{source_id}::resets"


class SnapshotDriver:
    """Snapshots of one pipeline's source; the SourceReader calls it, nothing else does."""

    def __init__(self, ctx: PipelineContext, log: Any) -> None:
        self.ctx = ctx
        self.source = ctx.source
        settings = getattr(ctx.config.source.config, "snapshot", None)
        self.settings = settings if isinstance(settings, SnapshotSettings) else SnapshotSettings()
        self.reader: ChunkReader | None = self.source.chunk_reader(self.settings)
        self.progress = ProgressLog(ctx.store, self.source.id, PatientWrites(ctx))
        listed = getattr(ctx.config.source.config, "tables", None)
        self.listed = ListedTables(ctx.store, self.source.id, listed, PatientWrites(ctx))
        self.state: SnapshotState | None = None
        self.refs: dict[str, TableRef] = {}
        self.windows: list[Window] = []
        """Windows written and not yet closed in the stream, in log order (at most DEPTH)."""
        self.next_key: dict[str, list[Any] | None] = {}
        """Where each table's next chunk starts: ahead of the saved progress while windows are open."""
        self.exhausted: set[str] = set()
        """Tables whose last chunk has been read (it may still be waiting for its window to close)."""
        self.bounds: dict[str, list[Any] | None] = {}
        """Each table's largest key when this run first read it: its snapshot ends there
        (``ChunkReader.bounded``)."""
        self.log = log
        self.status = ctx.snapshot
        self.status.waits.warn_s = self.settings.stream_lag_warning_s
        self.spared = False  # sinks without a checkpoint at the next opening too: given one (reader._spare)
        self.columns = ColumnChanges(self)
        self.patient = PatientWrites(ctx)
        self.resets_loaded = False

    @property
    def recovers(self) -> bool:
        """``when_needed``: a lost position means a new snapshot, not a halt."""
        return self.reader is not None and self.settings.mode == "when_needed"

    @property
    def copies_rows(self) -> bool:
        """A start without a checkpoint takes a snapshot (``mode`` other than ``never``)."""
        return self.reader is not None and self.settings.mode != "never"

    async def before_open(self, resume: Position | None) -> None:
        """No checkpoint and a snapshot to come: stream from now, not from the oldest change kept;
        or, when an earlier process started so and a snapshot it began is still stored, from
        where that one started (see ``Source.start_from``)."""
        source = self.source
        if not self.resets_loaded:
            doc = await self.ctx.store.get(resets_key(source.id))
            source.resets = as_int(doc, "resets") if doc is not None else 0
            self.resets_loaded = True
        source.from_now = resume is None and self.reader is not None and self.settings.mode != "never"
        if source.from_now and source.start_from is None:
            stored = await self.progress.stream_start()
            source.start_from = source.load_position(stored) if stored is not None else None

    async def opened(self, resume: Position | None, joined: bool = False) -> None:
        """The source is open after ``resume``: go on with a snapshot in progress, or start one.
        ``joined``: sinks without a checkpoint were added beside sinks that hold one (``resume``
        is theirs): the snapshot a start without a checkpoint would take is taken for them."""
        self.windows = []
        if self.reader is None:
            return
        await self.reader.open(self.settings.max_parallel_tables)
        if (unprepared := await self.reader.prepare()) is not None:
            self.log.warning("snapshot_unavailable", reason=unprepared)
        # A chunk every sink holds is one the new sinks never had: with them, from the start.
        state = await self.progress.load(resume.order if resume is not None and not joined else None)
        if state is not None and state.done:
            await self.progress.clear()
            state = None
        mode = self.settings.mode
        fresh, self.spared = not self.status.started_at_start or self.spared, False
        if joined and fresh:
            names = self.settings.tables
            if names is not None and state is not None:  # the one in progress goes on within it
                names = [*names, *(n for n in state.pending if n not in names)]
            state = await self._new(names, "initial")
        elif state is None and (
            (mode == "always" and fresh) or (resume is None and mode in ("initial", "when_needed"))
        ):
            state = await self._new(self.settings.tables, "initial")
        self.status.started_at_start = True  # reopenings after this (reconnects, rewinds) are no start
        await self._take(state)
        if not self.listed.checked:  # until it went through: a server down meanwhile asks again
            await self._tables_added(copying=resume is not None and not joined)

    async def _tables_added(self, copying: bool) -> None:
        """Copy the rows of tables listed since the last start (``copying``: not already
        copied by a snapshot of every table begun now), or say how to."""
        added = await self.listed.added() if copying else []
        copy, rest = copyable(added, self.settings.tables) if self.copies_rows else ([], added)
        if copy:
            try:
                await self.request(copy, "tables_added")
            except SnapshotRefused as exc:  # no primary key, say: named, streaming goes on
                self.log.error("tables_added_not_copied", tables=copy, reason=str(exc))
        if rest:
            pipeline = self.ctx.config.name
            self.log.warning(
                "tables_added_not_copied", tables=rest,
                reason="the stream carries their changes from now on; the rows they already had reach no sink",
                fix=f"deltaforge snapshot {pipeline} <table>…, or snapshot.mode initial to copy tables added to tables",
            )  # fmt: skip
        await self.listed.remember()

    async def recover(self, lost: PositionLost) -> None:
        """``when_needed`` and the position is gone: read from now, and snapshot everything again."""
        source = self.source
        await self.close()
        await source.close()
        # The coordinates may start again below what the sinks hold (a binlog reset, a server
        # restored from an older copy): counted before anything is read from now, so every
        # position read from here sorts after them, and no sink skips it as held already.
        resets = source.resets + 1
        await self.patient(lambda: self.ctx.store.put(resets_key(source.id), {"resets": resets}))
        source.resets = resets
        self.log.warning("position_lost_resnapshot", reason=str(lost), resets=resets)
        source.start_from = None  # lost: from now, as the snapshot about to begin
        source.from_now = True
        await source.open(None)
        await self.progress.clear()
        await self.opened(None)

    async def request(self, names: list[str], how: str) -> SnapshotState:
        """Snapshot ``names`` now (``how``: api, cli, signal), beside a snapshot already running."""
        if self.reader is None:
            raise SnapshotRefused(
                f"source {self.source.id!r} ({self.source.connector}) cannot take snapshots"
            )
        tables = await self.reader.tables(names)
        if self.state is None:
            state = await self._new([t.name for t in tables], "incremental", tables)
        else:
            state = self.state
            added = [t for t in tables if t.name not in state.pending]
            estimates = {t.name: await self.reader.estimate(t) for t in added}
            await self.progress.extend([t.name for t in added], estimates)
            for t in added:
                self.exhausted.discard(t.name)  # asked for again after it was read
                self.bounds.pop(t.name, None)
                self.next_key[t.name] = None
                state.pending.append(t.name)
                state.cursors.pop(t.name, None)
                state.rows[t.name] = 0
                state.estimates[t.name] = estimates[t.name]
                self.refs[t.name] = t
        self.log.info("snapshot_requested", tables=[t.name for t in tables], by=how, snapshot=state.id)
        await self._take(state)
        return state

    async def _new(
        self, names: list[str] | None, kind: str, tables: list[TableRef] | None = None
    ) -> SnapshotState:
        assert self.reader is not None
        if tables is None:
            tables = await self.reader.tables(names)
        state = SnapshotState(uuid.uuid4().hex[:12], kind, [t.name for t in tables])
        for t in tables:
            state.estimates[t.name] = await self.reader.estimate(t)
        source = self.source
        start = source.start_from if source.from_now and source.start_from is not None else None
        await self.progress.begin(state, start.to_doc() if start is not None else None)
        self.log.info("snapshot_started", snapshot=state.id, kind=kind, tables=state.pending)
        return state

    async def _take(self, state: SnapshotState | None) -> None:
        """Make ``state`` the running snapshot."""
        if state is not None and (self.state is None or self.state.id != state.id):
            # another snapshot: every table from its progress, up to its largest key from now
            self.next_key, self.exhausted, self.bounds = {}, set(), {}
        self.state = state
        if state is None:
            return
        for name in state.pending:
            if name not in self.next_key and name not in self.exhausted:
                self.next_key[name] = state.cursors.get(name)
        assert self.reader is not None
        missing = [n for n in state.pending if n not in self.refs]
        if missing:
            for t in await self.reader.tables(missing):
                self.refs[t.name] = t
        self.status.follow(state)

    async def read(self) -> list[Event]:
        """The source's next events with snapshot rows woven in."""
        # Two windows in flight: the next chunk is selected while the stream makes its way to the
        # last one's high watermark (DBLog needs only each window's marks in log order).
        while self.state is not None and len(self.windows) < DEPTH and await self._open_window(self.state):
            pass
        events = await self.source.read()
        return events if self.reader is None else await self.through(events)

    def caught_up(self) -> bool:
        """The source's answer, except while a window is in flight: its rows come with its high
        watermark, soon, so the batch may grow (``max_ms`` still bounds the wait)."""
        return not self.windows and self.source.caught_up()

    async def _open_window(self, state: SnapshotState) -> bool:
        """Write a window with the next chunk of each active table; False when none is left to read."""
        reader = self.reader
        assert reader is not None
        size = self.settings.chunk_size
        width = self.settings.max_parallel_tables if reader.parallel else 1
        active = [self.refs[n] for n in state.pending if n not in self.exhausted][:width]
        if not active:
            return False
        for t in active:
            progress = self.status.tables.get(t.name)
            if progress is not None and progress.started_at is None:
                progress.started_at = time.time()
                self.log.info("snapshot_table_started", snapshot=state.id, table=t.name,
                              rows=state.rows.get(t.name, 0), estimate=state.estimates.get(t.name, 0))  # fmt: skip
        if reader.bounded:
            for t in active:
                if t.name not in self.bounds:
                    self.bounds[t.name] = await reader.last_key(t)
        wid = uuid.uuid4().hex[:16]
        await reader.watermark("open", wid)
        results = await asyncio.gather(*(reader.chunk(t, self.next_key.get(t.name), size) for t in active))
        await reader.watermark("close", wid)
        chunks = {}
        for t, (rows, last, more) in zip(active, results, strict=True):
            if more and reader.bounded:  # the table's end when this run began, or nothing after it
                bound = self.bounds.get(t.name)
                more = bound is not None and last is not None and await reader.remaining(t, last, bound)
            chunks[t.name] = Chunk(t, rows, last, more)
            self.next_key[t.name] = last
            if not more:
                self.exhausted.add(t.name)
        self.windows.append(Window(wid, chunks, read_at=time.monotonic()))
        return True

    async def through(self, events: list[Event]) -> list[Event]:
        """Swallow watermarks and signals (as heartbeats: they still move checkpoints), watch the
        window's changes, and emit its rows at its high watermark."""
        reader = self.reader
        assert reader is not None
        out: list[Event] = []
        for e in events:
            if reader.is_signal(e):
                mark = reader.mark_of(e)
                window = next((w for w in self.windows if mark is not None and w.id == mark[1]), None)
                if mark is not None and window is not None:
                    if mark[0] == "open":
                        window.opened = True
                    else:
                        out.extend(await self._close(window, e))
                        continue
                elif (names := reader.signal_of(e)) is not None:
                    await self._signalled(names)
                out.append(with_images(e, "h", None, None))
                continue
            for w in self.windows:  # one at most is open: the next one's low mark follows this one's high
                if w.opened:
                    watch(w, reader.name_of(e), e)
            out.append(e)
        return out

    async def _signalled(self, names: list[str]) -> None:
        try:
            await self.request(names, "signal")
        except SnapshotRefused as exc:  # a bad signal row is the user's input: say so, go on
            self.log.error("snapshot_signal_refused", tables=names, error=str(exc))

    async def _close(self, window: Window, high: Event) -> list[Event]:
        """The rows left in ``window``, just after its high watermark, then a heartbeat that moves
        checkpoints past the watermark once every row is in."""
        reader, state = self.reader, self.state
        assert reader is not None and state is not None
        self.windows.remove(window)
        at, base, ts = high.source.position, high.order, int(time.time() * 1000)
        tx_id, tenant, wid = f"snapshot:{state.kind}:{window.id}", self.ctx.config.tenant, window.id
        out: list[Event] = []
        counts: dict[str, int] = {}
        for t, rows in window.survivors():
            info = reader.source_info(t, at, ts)  # one origin for the table's rows
            # Snapshot rows: ``op: r`` with the high watermark's position (resume from there
            # re-reads the window) and an order just after it. Built inline, with no call per
            # row: a chunk's rows are most of what a snapshot builds.
            out += [
                new_event("r", None, row, info, tx_id, False, f"{wid}:{i}", (*base, i), at, tenant, 128 + 32 * len(row))
                for i, row in enumerate(rows, len(out))
            ]  # fmt: skip
            counts[t.name] = len(rows)
        n = len(out)
        if n:
            out[-1] = replace(out[-1], tx_end=True)
        closing = replace(high, op="h", before=None, after=None, order=(*base, n))
        for name, chunk in window.chunks.items():
            state.rows[name] = state.rows.get(name, 0) + counts.get(name, 0)
            if chunk.last is not None:
                state.cursors[name] = chunk.last
            progress = self.status.tables.get(name)
            if progress is not None:
                progress.rows_this_run += counts.get(name, 0)
            if not chunk.full:
                state.pending.remove(name)
                self.log.info("snapshot_table_finished", snapshot=state.id, table=name, rows=state.rows[name])
        if state.done and out:
            out[-1] = replace(out[-1], event_id=f"{out[-1].event_id}:last")
        self.status.rows_total += n
        waited = time.monotonic() - window.read_at
        self.log.debug("snapshot_chunk", snapshot=state.id, rows=n, removed=window.removed,
                       waited_ms=round(waited * 1000, 1))  # fmt: skip
        await self.progress.mark(closing.order, state)
        self.status.follow(state)
        self._said(state, waited)
        if state.done:
            self.log.info(
                "snapshot_finished", snapshot=state.id, kind=state.kind, rows=sum(state.rows.values())
            )
            self.status.end(state)
            self.state = None
        return [*out, closing]

    def _said(self, state: SnapshotState, waited: float) -> None:
        """A window's wait for its high watermark, said when the stream falls behind (or is back)."""
        waits = self.status.waits
        said = waits.seen(waited)
        if said == "behind":
            self.log.warning(
                "snapshot_stream_behind", snapshot=state.id, waited_s=round(waited, 3), warn_s=waits.warn_s,
                reason="a snapshot window waited this long for its high watermark to come back through "
                "the stream: the stream reads behind what the database writes, and each chunk waits "
                "for it (the snapshot is as slow as the stream; nothing is lost)",
            )  # fmt: skip
        elif said == "caught_up":
            self.log.info("snapshot_stream_caught_up", snapshot=state.id, waited_s=round(waited, 3))

    async def confirm(self, durable: Position) -> None:
        if self.reader is not None:
            await self.progress.confirm(durable.order)

    async def close(self) -> None:
        self.windows, self.next_key, self.exhausted, self.bounds = [], {}, set(), {}
        if self.reader is not None:
            await self.reader.close()
