"""Checkpoints are written behind delivery: the next batch goes out while the last one's
checkpoint is being made durable, and nothing counts as committed before it is."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import anyio
from structlog.testing import capture_logs

from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.pipeline.tree import deliver_buffered
from deltaforge.position import PositionDoc
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from tests.helpers import file_size_limit, first_occurrences, restarts, wait_until
from tests.kit import ScriptedSink, SeqPosition, SyntheticSource, config, sink_doc

KEY = sink_key("src", "a")


class HeldStore(MemoryCheckpointStore):
    """A checkpoint store whose writes wait until the test lets them through, one by one or all.

    ``written`` is each write's ``seq`` for sink ``a``, in the order the writes became durable.
    """

    def __init__(self, fail: str | None = None) -> None:
        super().__init__()
        self.permits = asyncio.Semaphore(0)
        self.open = False
        self.held = 0
        self.written: list[int] = []
        self.fail = fail

    def let_one_through(self) -> None:
        self.permits.release()

    def let_all_through(self) -> None:
        self.open = True
        self.permits.release()

    async def put_many(self, values: dict[str, PositionDoc]) -> None:
        if not self.open:
            self.held += 1
            await self.permits.acquire()
            self.held -= 1
            if self.open:
                self.permits.release()  # the next one passes too
        if self.fail is not None:
            raise OSError(28, self.fail)
        await super().put_many(values)
        self.written.append(int(values[KEY]["seq"]))


async def stored(store: MemoryCheckpointStore) -> int | None:
    cp = await store.get(KEY)
    return None if cp is None else int(cp["seq"])


async def test_the_next_batch_is_delivered_while_the_last_ones_checkpoint_is_written() -> None:
    total = 5000
    store = HeldStore()
    a = ScriptedSink("a")
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 50})
    runner = PipelineRunner(cfg, store=store, sinks={"a": a}, source=SyntheticSource(total, chunk=50))
    task = asyncio.create_task(runner.run())
    # Batch 2 reaches the sink while batch 1's checkpoint write is held: delivery did not wait for it.
    await wait_until(lambda: len(a.received) >= 100, what="a second batch delivered during the first write")
    await anyio.wait_all_tasks_blocked()  # nothing can move until a write ends
    stats = runner.ctx.stats
    # It runs ahead by one full batch at most, and nothing is committed that is not durable.
    assert len(a.received) == 100
    assert store.held == 1 and store.written == []
    assert stats.events_committed == 0 and stats.batches_committed == 0 and stats.last_checkpoint is None
    assert runner.ctx.durable == {}  # so the source is not told to let go of anything yet
    assert await stored(store) is None

    store.let_one_through()
    await wait_until(lambda: stats.events_committed == 50, what="the first batch committed")
    store.let_all_through()
    await wait_until(lambda: stats.events_committed == total, what="all committed")
    await runner.drain()
    await asyncio.wait_for(task, 10)
    assert first_occurrences(a.received) == list(range(1, total + 1))
    assert await stored(store) == total
    assert store.written == sorted(set(store.written))  # one write at a time, in batch order
    assert store.written[0] == 50


async def test_what_was_handed_on_counts_as_delivered_only_once_its_checkpoints_are_durable() -> None:
    """A drain (and the reader's settling before an error) asks that everything handed past the
    reader be delivered *and checkpointed*: it returns only after the last write is durable, though
    batches were delivered while earlier writes were held."""
    total = 120  # batches of 50, 50 and 20
    store = HeldStore()
    a = ScriptedSink("a")
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 50})
    runner = PipelineRunner(cfg, store=store, sinks={"a": a}, source=SyntheticSource(total, chunk=50))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_read == total, what="the source read to its end")
    tree = runner.tree
    settled = asyncio.ensure_future(deliver_buffered(tree.accumulator, None, tree.coordinator, 30))
    # Let the writes through one at a time, each time nothing else can move.
    while True:
        await anyio.wait_all_tasks_blocked()
        if settled.done():
            break
        store.let_one_through()
    await settled
    assert len(a.received) == total
    assert await stored(store) == total
    assert runner.ctx.stats.events_committed == total
    store.let_all_through()
    await runner.drain()
    await asyncio.wait_for(task, 10)


async def test_a_checkpoint_write_that_fails_is_tried_again_degraded_until_it_holds() -> None:
    """A store whose writes fail with an OSError (a full disk) is waited for: the pipeline stays up,
    ``degraded`` naming the store, nothing counts as committed meanwhile, delivery stops once its
    bound of unwritten batches is reached, and nothing restarts. Once writes hold again, every
    batch is committed, each delivered once. (Before: every failure restarted the pipeline's
    actors until the restart limit stopped it for good.)"""
    store = HeldStore(fail="No space left on device")
    store.let_all_through()
    a = ScriptedSink("a")
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 50},
                 supervision={"max_restarts": 2, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}})  # fmt: skip
    total = 5000
    runner = PipelineRunner(cfg, store=store, sinks={"a": a}, source=SyntheticSource(total, chunk=50))
    task = asyncio.create_task(runner.run())
    outages = runner.ctx.availability
    await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
    await wait_until(lambda: outages.view()["state_store"]["attempts"] > 20, what="writes tried again")
    assert runner.state == "running" and runner.degraded
    assert (
        outages.view()["state_store"]["last_error"]
        == "OSError: [Errno 28] No space left on device (still trying)"
    )
    assert runner.ctx.stats.events_committed == 0 and await stored(store) is None
    assert len(a.received) < total  # delivery waits for the writes: a bounded backlog, not all of it
    store.fail = None
    await wait_until(lambda: runner.ctx.stats.events_committed >= total, what="everything committed")
    assert not outages.degraded
    await runner.drain()
    await task
    assert runner.ctx.epoch == 1 and restarts(runner.snapshot()) == 0  # no restart
    assert a.received == list(range(1, total + 1))  # each once, in order
    assert await stored(store) == total


async def test_a_damaged_store_stops_the_pipeline_and_commits_nothing() -> None:
    """What retrying cannot mend (a damaged database) still stops the pipeline (restarts from the
    durable checkpoints, here until the intensity runs out), and no batch whose checkpoint was
    never stored is counted as committed."""
    store = DamagedStore()
    a = ScriptedSink("a")
    cfg = config(
        sinks=[sink_doc("a")],
        batch={"max_events": 50},
        supervision={"max_restarts": 2, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}},
    )
    runner = PipelineRunner(
        cfg, store=store, sinks={"a": a}, source=SyntheticSource(500, chunk=50), rng=random.Random(3)
    )
    await asyncio.wait_for(runner.run(), 30)  # a bound for a hang: the restarts run out at once
    assert runner.state == "failed"
    snap = runner.snapshot().find("CheckpointCommitter")
    assert snap is not None and snap.last_error == "DatabaseError: database disk image is malformed"
    assert runner.ctx.stats.events_committed == 0 and runner.ctx.stats.batches_committed == 0
    assert runner.ctx.stats.last_checkpoint is None
    assert await stored(store) is None
    assert a.received  # delivered, never committed: the next start delivers it again


async def test_a_real_disk_that_refuses_writes_is_waited_for_by_the_sqlite_store(tmp_path: Path) -> None:
    """The same through SQLite on a real file: this process may not grow files for a while
    (RLIMIT_FSIZE: the kernel refuses writes past the limit, EFBIG, as a full disk refuses them
    with ENOSPC; SQLite says "database or disk is full" for both)."""
    a = ScriptedSink("a")
    storage = {"type": "sqlite", "path": str(tmp_path / "state.db")}
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 50}, storage=storage)
    total = 3000
    runner = PipelineRunner(cfg, sinks={"a": a}, source=SyntheticSource(total, chunk=50))
    task = asyncio.create_task(runner.run())
    outages = runner.ctx.availability
    await wait_until(lambda: runner.ctx.stats.events_committed > 0, what="a first commit")
    with file_size_limit(0):  # SQLite says "disk I/O error" or "database or disk is full"
        await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
        assert outages.view()["state_store"]["last_error"].startswith("OperationalError: ")
        committed = runner.ctx.stats.events_committed
        await wait_until(lambda: outages.view()["state_store"]["attempts"] > 5, what="writes tried again")
        assert runner.ctx.stats.events_committed == committed and runner.state == "running"
    await wait_until(lambda: runner.ctx.stats.events_committed >= total, what="everything committed")
    await runner.drain()
    await task
    assert restarts(runner.snapshot()) == 0 and a.received == list(range(1, total + 1))


async def test_a_schema_change_met_on_a_full_disk_is_recorded_once_there_is_room(tmp_path: Path) -> None:
    """The reader records a table's new schema in the store: on a full disk it waits (degraded,
    reading held) and records it once writes hold; before, its error restarted the pipeline until
    the restart limit stopped it."""
    storage = {"type": "sqlite", "path": str(tmp_path / "state.db")}
    source = SchemaWhenDue(500, chunk=50)
    runner = PipelineRunner(config(batch={"max_events": 50}, storage=storage), source=source)
    task = asyncio.create_task(runner.run())
    outages = runner.ctx.availability
    await wait_until(lambda: runner.ctx.stats.events_committed >= 500, what="the backlog committed")
    with file_size_limit(0):
        source.due.set()  # met at the next (empty) read
        await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
        await wait_until(lambda: outages.view()["state_store"]["attempts"] > 5, what="writes tried again")
        assert source.announced and runner.state == "running"
    await wait_until(lambda: not outages.degraded, what="the store back")
    history = await runner.store.schema_history("src", "db.t")
    await runner.drain()
    await task
    assert restarts(runner.snapshot()) == 0
    assert [h["columns"] for h in history] == [[{"name": "id", "type": "INTEGER"}]]


class SchemaWhenDue(SyntheticSource):
    """A SyntheticSource that meets a table's schema once ``due`` is set (at the next read)."""

    def __init__(self, total: int, chunk: int) -> None:
        super().__init__(total, chunk=chunk)
        self.due = asyncio.Event()
        self.announced = False

    def take_schema_changes(self) -> list[Any]:
        if not self.due.is_set() or self.announced:
            return []
        self.announced = True
        return [("db.t", [{"name": "id", "type": "INTEGER"}], SeqPosition(self.next - 1))]


class DamagedStore(MemoryCheckpointStore):
    async def put_many(self, values: dict[str, PositionDoc]) -> None:
        raise sqlite3.DatabaseError("database disk image is malformed")


async def test_a_stop_without_a_drain_still_writes_what_was_delivered() -> None:
    """``stop_now`` (a second signal, a restart) cuts delivery short but writes the checkpoints
    of the batches already delivered on the way out, so the next start delivers again only what
    was not delivered."""
    store = HeldStore()
    a = ScriptedSink("a")
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 50})
    runner = PipelineRunner(cfg, store=store, sinks={"a": a}, source=SyntheticSource(5000, chunk=50))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: len(a.received) >= 100, what="a second batch delivered during the first write")
    runner.stop_now()
    await anyio.wait_all_tasks_blocked()  # the stop waits on the held write
    assert not task.done()
    store.let_all_through()
    await asyncio.wait_for(task, 10)
    assert len(a.received) == 100
    assert await stored(store) == 100


async def test_a_store_that_cannot_be_created_on_a_full_disk_is_waited_for(tmp_path: Path) -> None:
    """A start on a full disk: SQLite cannot create the store (or its WAL files). That is waited
    for as its writes are, degraded with ``state_store`` listed, and the pipeline starts once the
    disk takes writes; before, it failed at once ("cannot open the sqlite store")."""
    a = ScriptedSink("a")
    storage = {"type": "sqlite", "path": str(tmp_path / "state.db")}
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 50}, storage=storage)
    runner = PipelineRunner(cfg, sinks={"a": a}, source=SyntheticSource(200, chunk=50))
    outages = runner.ctx.availability
    with file_size_limit(0):
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
        assert outages.view()["state_store"]["last_error"].startswith("OperationalError: disk I/O error")
        await wait_until(lambda: outages.view()["state_store"]["attempts"] > 3, what="the open tried again")
        assert runner.state == "starting" and runner.degraded and a.received == []
    await wait_until(lambda: runner.ctx.stats.events_committed >= 200, what="everything committed")
    assert not outages.degraded
    await runner.drain()
    await task
    assert runner.state == "stopped" and a.received == list(range(1, 201))


async def test_a_stop_while_the_store_waits_for_its_disk_ends_the_wait(tmp_path: Path) -> None:
    """A drain asked while the store cannot be opened stops the pipeline then, not after the
    backoff (here an hour, so a wait that ignored the stop would hang the test)."""
    storage = {"type": "sqlite", "path": str(tmp_path / "state.db")}
    hour = {"backoff": {"base_ms": 3_600_000, "max_ms": 3_600_000}}
    runner = PipelineRunner(config(storage=storage, supervision=hour), source=SyntheticSource(10))
    with file_size_limit(0), capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: "state_store" in runner.ctx.availability.view(), what="the store down")
        await runner.drain()
        with anyio.fail_after(30):  # a guard against a hang, not a timing goal
            await task
    assert runner.state == "stopped" and runner.failure is None
    # the log says the pipeline stopped, as every other way out does (it used to say nothing)
    assert [e["state"] for e in logs if e["event"] == "pipeline_stopped"] == ["stopped"]


async def test_the_store_is_listed_as_down_until_every_writer_that_failed_gets_through() -> None:
    """The committer, the reader, the DLQ and the reconciler all write to the store. One writer's
    success while another's write still fails is not the store's recovery: it stays listed (it
    used to be cleared, and listed again at the other's next failure, with a new ``since``)."""
    ctx = PipelineContext(config(), MemoryCheckpointStore(), SyntheticSource(1), {})
    outages = ctx.availability
    full, tried, through = {"a": True, "b": True}, {"a": 0, "b": 0}, []

    async def writer(who: str) -> None:
        async def write() -> None:
            tried[who] += 1
            if full[who]:
                raise OSError(28, "No space left on device")

        await PatientWrites(ctx)(write)
        through.append(who)

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer, "a")
        tg.start_soon(writer, "b")
        await wait_until(lambda: min(tried.values()) > 2, what="both writers refused")
        since = outages.view()["state_store"]["since"]
        full["b"] = False
        await wait_until(lambda: through == ["b"], what="b's write through")
        assert outages.view()["state_store"]["since"] == since  # a still waits: the same outage
        full["a"] = False
    assert through == ["b", "a"] and not outages.degraded
