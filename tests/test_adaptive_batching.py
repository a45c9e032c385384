"""Adaptive batching: a batch goes on as soon as the source is caught up, and grows only while
more is waiting (issue 18). ``max_ms`` is an hour here, so no timed flush can stand in."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from actors import Actor, ActorCell
from deltaforge.config import parse_pipeline
from deltaforge.pipeline.accumulator import Accumulator
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import DeliverBatch, EventsRead
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import Source
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import jsonl, wait_until
from tests.kit import SyntheticSource, config, make_event
from tests.mysql_kit import fresh_db as my_fresh_db
from tests.mysql_kit import source as my_source
from tests.postgres_kit import fresh_db as pg_fresh_db
from tests.postgres_kit import source as pg_source
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.test_turso_source import source as turso_source
from tests.test_turso_source import writer as turso_writer

HOUR_MS = 3_600_000


class Batches(Actor):
    """Stands in for the coordinator: records each batch's sequence numbers."""

    def __init__(self, got: list[list[int]]) -> None:
        super().__init__()
        self.got = got

    async def receive(self, message: Any) -> Any:
        assert isinstance(message, DeliverBatch)
        self.got.append([e.order[0] for e in message.batch.events])


def chunk(first: int, n: int) -> list[Any]:
    return [make_event(s, tx=s) for s in range(first, first + n)]


async def feed(chunks: list[tuple[int, bool]], max_events: int = 25) -> list[list[int]]:
    """Tell the Accumulator chunks of ``(size, caught_up)``; the batches it has handed on once
    every task is blocked (nothing more can happen without a new message or the hour passing)."""
    got: list[list[int]] = []
    ctx = PipelineContext(
        config(batch={"max_events": max_events, "max_ms": HOUR_MS}),
        MemoryCheckpointStore(),
        SyntheticSource(0),
        {},
    )
    sink = ActorCell("batches", lambda: Batches(got))
    acc = ActorCell("acc", lambda: Accumulator(ctx, sink.ref))  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(sink.run)
        await tg.start(acc.run)
        seq = 1
        for size, caught_up in chunks:
            await acc.ref.tell(EventsRead(chunk(seq, size), 0, caught_up))
            seq += size
            await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    return got


@pytest.mark.anyio
async def test_a_caught_up_chunk_goes_on_at_once() -> None:
    assert await feed([(3, True)]) == [[1, 2, 3]]


@pytest.mark.anyio
async def test_a_batch_grows_while_more_is_waiting_and_goes_once_caught_up() -> None:
    got = await feed([(10, False), (10, False)])
    assert got == []  # 20 < max_events and more is coming: wait for it
    got = await feed([(10, False), (10, False), (10, False), (7, True)])
    assert got == [list(range(1, 26)), list(range(26, 38))]  # cut at the limit, then the rest at once


@pytest.mark.anyio
async def test_a_held_batch_goes_once_told_the_source_is_caught_up_without_events() -> None:
    """The source said more was coming, and none of it was events (see the PostgreSQL test below)."""
    assert await feed([(10, False), (0, True)]) == [list(range(1, 11))]


class GatedBatches(Batches):
    """A coordinator busy with its first batch until ``gate`` is set; one batch may wait in its
    mailbox (``max_inflight`` 1)."""

    mailbox_size = 1

    def __init__(self, got: list[list[int]], gate: anyio.Event) -> None:
        super().__init__(got)
        self.gate = gate

    async def receive(self, message: Any) -> Any:
        await super().receive(message)
        await self.gate.wait()


async def feed_busy(
    chunks: list[int], max_events: int, before_freeing: list[list[int]] | None = None
) -> list[list[int]]:
    """Tell the Accumulator caught-up chunks of these sizes while a :class:`GatedBatches` is busy
    with the first batch (each chunk's tell in a task of its own: a full mailbox holds it);
    then free it. The batches handed on once every task is blocked. ``before_freeing``, if
    given, is filled with the batches handed on while it was still busy."""
    got: list[list[int]] = []
    gate = anyio.Event()
    ctx = PipelineContext(
        config(batch={"max_events": max_events, "max_ms": HOUR_MS}),
        MemoryCheckpointStore(),
        SyntheticSource(0),
        {},
    )
    busy = ActorCell("batches", lambda: GatedBatches(got, gate))
    acc = ActorCell("acc", lambda: Accumulator(ctx, busy.ref))  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(busy.run)
        await tg.start(acc.run)
        seq = 1
        for size in chunks:
            tg.start_soon(acc.ref.tell, EventsRead(chunk(seq, size), 0, True))
            seq += size
            await anyio.wait_all_tasks_blocked()
        if before_freeing is not None:
            before_freeing.extend(got)
        gate.set()
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    return got


@pytest.mark.anyio
async def test_a_batch_grows_while_the_sinks_deliver_the_one_before_and_goes_once_they_are_free() -> None:
    """Caught-up chunks while the sinks are busy with the first batch make one batch, which goes
    on the moment they are free (``max_ms`` is an hour: no timer can stand in)."""
    while_busy: list[list[int]] = []
    got = await feed_busy([3, 3, 4, 2], max_events=25, before_freeing=while_busy)
    assert while_busy == [[1, 2, 3]]  # being delivered; nothing queued behind it
    assert got == [[1, 2, 3], list(range(4, 13))]


@pytest.mark.anyio
async def test_max_events_still_cuts_while_the_batch_before_waits() -> None:
    """Held for the sinks, a batch still stops at ``max_events`` (and queues, as before)."""
    assert await feed_busy([2, 2, 3, 3, 2], max_events=5) == [[1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11, 12]]


# -- through real sources: with max_ms an hour, each committed row still arrives ----------------


def to_a_file(source: Source, tmp: Path) -> tuple[PipelineRunner, Path]:
    """A pipeline from ``source`` to a file ``events.jsonl`` in ``tmp``, ``max_ms`` an hour."""
    out = tmp / "events.jsonl"
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "adaptive"},
        "spec": {
            "source": {"type": "turso", "config": {"id": source.id, "path": str(tmp / "unused.db")}},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}],
            "batch": {"max_events": 10_000, "max_ms": HOUR_MS},
        },
    }
    return PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), source=source), out


async def one_row_at_a_time(
    source: Source,
    write: Callable[[int], Awaitable[None]],
    tmp: Path,
    capturing: Callable[[], Awaitable[bool]],
) -> None:
    """A pipeline from ``source`` to a file with ``max_ms`` an hour: three rows written one by
    one each reach the file before the next is written: the source said it was caught up."""
    runner, out = to_a_file(source, tmp)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        await wait_until(lambda: runner.state == "running", timeout=30, what="pipeline running")
        while not await capturing():
            await anyio.sleep(0.01)
        for i in (1, 2, 3):
            await write(i)
            await wait_until(lambda: len(rows_of(out)) == i, timeout=20, what=f"row {i} in the file")  # noqa: B023
        assert [r["after"]["id"] for r in rows_of(out)] == [1, 2, 3]
        await runner.drain()


async def always() -> bool:
    return True  # no checkpoint: the source reads from its oldest change


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [d for d in jsonl(out) if d.get("op") == "c"]


@pytest.mark.anyio
async def test_postgres_rows_arrive_one_by_one_with_max_ms_an_hour(
    postgres: Postgres, tmp_path: Path
) -> None:
    db = await pg_fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")

        async def write(i: int) -> None:
            await conn.execute("INSERT INTO t VALUES ($1, 'x')", i)

        async def slot_exists() -> bool:
            found = await conn.fetchval(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f"s_{db}"
            )
            return bool(found)

        await one_row_at_a_time(pg_source(postgres, db), write, tmp_path, slot_exists)
    finally:
        await conn.execute("SELECT pg_drop_replication_slot($1)", f"s_{db}")  # the session's slots are few
        await conn.close()


@pytest.mark.anyio
async def test_mariadb_rows_arrive_one_by_one_with_max_ms_an_hour(mariadb: MariaDB, tmp_path: Path) -> None:
    db = my_fresh_db(mariadb)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v TEXT)")

    async def write(i: int) -> None:
        with mariadb.root() as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO {db}.t VALUES (%s, 'x')", (i,))

    await one_row_at_a_time(my_source(mariadb, [f"{db}.t"]), write, tmp_path, always)


@pytest.mark.anyio
async def test_turso_rows_arrive_one_by_one_with_max_ms_an_hour(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = turso_writer(path)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    conn.commit()

    async def write(i: int) -> None:
        conn.execute("INSERT INTO t VALUES (?, 'x')", (i,))
        conn.commit()

    await one_row_at_a_time(turso_source(path), write, tmp_path, always)


# -- through a real source: a backlog is not caught up until it is read ---------------------------


def slow_pump(src: Any) -> None:
    """``src``'s decoder frames turned into events by a pump that takes 5 ms a frame: ``serve``'s
    side is the slower, as in a drain to Kafka, where the child waits on the pipe and its
    server's stream waits in the socket. Each frame's events are handed on as soon as they are
    made and read at once, so what was handed on is all read: only the child can say that more
    is coming."""
    handle = src._handle

    def slowly(frame: tuple[Any, ...]) -> Any:
        time.sleep(0.005)  # the work of a slower serve, in the pump's thread: not a wait for anything
        return handle(frame)

    src._handle = slowly


async def read_backlog_watching_caught_up(src: Source, rows: int) -> None:
    """Read ``rows`` rows (ids 1..rows) as fast as ``src`` hands them on: it must not say "caught
    up" until the backlog is read, or every batch is one frame (an ``exactly_once`` Kafka
    transaction each). Once it is read, it says so."""
    said: list[bool] = []  # caught_up() after each read that handed on rows, but the last
    ids: list[int] = []
    while len(ids) < rows:
        got = [e.after["id"] for e in await src.read() if e.op == "c" and e.after is not None]
        ids.extend(got)
        if got and len(ids) < rows:
            said.append(src.caught_up())
    assert ids == list(range(1, rows + 1))
    # One or two reads may find the server not yet ready with the next transaction (the first,
    # or a slow moment of its own): a batch cut early, not wrong. Saying "caught up" whenever
    # everything the child had handed on was read made it all of them.
    assert sum(said) <= 3, f"caught up after {sum(said)} of {len(said)} reads with more to come"
    ended = time.monotonic() + 10
    while not src.caught_up():  # the last frame said nothing more was sent
        assert time.monotonic() < ended, "not caught up once the backlog was read"
        assert [e for e in await src.read() if e.op == "c"] == []


@pytest.mark.anyio
async def test_the_postgres_source_is_not_caught_up_while_its_server_has_sent_more(
    postgres: Postgres,
) -> None:
    """Forty transactions of 500 rows wait in the slot when the source opens; its decoder child
    reads about one of them per read (libpq's buffer), its pump slowed (:func:`slow_pump`)."""
    db = await pg_fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    src = pg_source(postgres, db)
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        await src.open(None)  # the slot, from now
        await src.close()
        for start in range(0, 20_000, 500):
            await conn.execute(
                "INSERT INTO t SELECT g, 'row-' || g FROM generate_series($1::int, $2::int) g",
                start + 1, start + 500,
            )  # fmt: skip
        src = pg_source(postgres, db)
        slow_pump(src)
        await src.open(None)
        await read_backlog_watching_caught_up(src, 20_000)
    finally:
        await src.close()
        await conn.execute("SELECT pg_drop_replication_slot($1)", f"s_{db}")  # the session's slots are few
        await conn.close()


@pytest.mark.anyio
async def test_the_mariadb_source_is_not_caught_up_while_its_server_has_sent_more(mariadb: MariaDB) -> None:
    """Forty transactions of 500 rows in the binlog when the source opens; its decoder child
    hands on frames of up to ``read_chunk`` rows (500 here), its pump slowed (:func:`slow_pump`)."""
    db = my_fresh_db(mariadb)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v TEXT)")
        for start in range(0, 20_000, 500):
            cur.execute(
                f"INSERT INTO {db}.t VALUES "
                + ", ".join(f"({i}, 'row-{i}')" for i in range(start + 1, start + 501))
            )
    src = my_source(mariadb, [f"{db}.t"], read_chunk=500)
    slow_pump(src)
    await src.open(None)  # from the oldest binlog kept
    try:
        await read_backlog_watching_caught_up(src, 20_000)
    finally:
        await src.close()


@pytest.mark.anyio
async def test_a_batch_held_for_more_goes_once_what_followed_held_nothing_of_ours(
    postgres: Postgres, tmp_path: Path
) -> None:
    """The backlog: 3,000 rows in one transaction, then one of another application's logical
    messages (5,000 of them, several reads). The decoder child says more is coming as it hands
    the rows on, then reads only what is not ours: nothing to hand on but that nothing more is
    coming. With ``max_ms`` and the heartbeat an hour, the rows reach the file only if the
    reader hears that."""
    db = await pg_fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    src = pg_source(postgres, db, heartbeat_ms=HOUR_MS)
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        await src.open(None)  # the slot, from now
        await src.close()
        await conn.execute("INSERT INTO t SELECT g, 'row-' || g FROM generate_series(1, 3000) g")
        await conn.execute(
            "SELECT count(pg_logical_emit_message(true, 'another-app', 'x')) FROM generate_series(1, 5000)"
        )
        runner, out = to_a_file(pg_source(postgres, db, heartbeat_ms=HOUR_MS), tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            await wait_until(lambda: len(rows_of(out)) == 3000, timeout=30, what="the rows in the file")
            assert [r["after"]["id"] for r in rows_of(out)] == list(range(1, 3001))
            await runner.drain()
    finally:
        await conn.execute("SELECT pg_drop_replication_slot($1)", f"s_{db}")  # the session's slots are few
        await conn.close()
