"""The snapshot algorithm against a simulated database, explored by hypothesis.

``FakeDB`` is a table and a change log; writes land at chosen points of each window (before
the low watermark, between it and the chunk select, between the select and the high
watermark, between reads), including primary-key moves across chunk boundaries, with chunks
of a few rows. Some runs crash: everything after the last durable checkpoint is lost and the
pipeline resumes from it. The sink's replay must equal the table, and a key's last event
must be its newest; without crashes a key's events must arrive in version order.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import anyio
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltaforge.configmodel import SnapshotSettings
from deltaforge.envelopes import snapshot_marker
from deltaforge.events import Event, Row, SourceInfo
from deltaforge.pipeline.context import PipelineContext
from deltaforge.position import Position, PositionDoc
from deltaforge.snapshot.chunks import ChunkReader, answered, debezium_signal
from deltaforge.snapshot.driver import SnapshotDriver
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import Source, SourceUnavailable, own_position
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.kit import SeqPosition, config
from tests.snapshot_kit import key_events, last_not_newest, out_of_order, replay

SIGNAL = "db.signal"


class FakeDB:
    """``items(id, v)`` and its change log; ``writes`` are applied when a hook asks."""

    def __init__(self, rows: int, writes: list[tuple[str, int]], draw: Callable[[], int]) -> None:
        self.table = {i: i for i in range(1, rows + 1)}
        self.log: list[Event] = []
        self.v = rows
        self.next_id = rows + 1
        self.writes = list(writes)
        self.draw = draw  # how many pending writes land at a hook

    def _append(self, op: str, table: str, before: Row | None, after: Row | None) -> None:
        seq = len(self.log) + 1
        pos = SeqPosition(seq)
        db, _, name = table.partition(".")
        info = SourceInfo("fake", db, name, pos, 0, None, ("id",))
        self.log.append(Event(op, before, after, info, f"tx{seq}", True, str(seq), (seq,), pos))

    def hook(self) -> None:
        for _ in range(min(self.draw(), len(self.writes))):
            self._write(*self.writes.pop(0))

    def _write(self, kind: str, pick: int) -> None:
        self.v += 1
        live = sorted(self.table)
        if kind == "insert" or not live:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.table[rid] = self.v
            self._append("c", "db.items", None, {"id": rid, "v": self.v})
            return
        rid = live[pick % len(live)]
        before = {"id": rid, "v": self.table[rid]}
        if kind == "update":
            self.table[rid] = self.v
            self._append("u", "db.items", before, {"id": rid, "v": self.v})
        elif kind == "delete":
            del self.table[rid]
            self._append("d", "db.items", before, None)
        else:  # move: to a fresh key past everything, or to a free key below (a chunk already read)
            free = [k for k in range(1, max(live)) if k not in self.table]
            new = free[pick % len(free)] if free and pick % 2 else self.next_id
            self.next_id = max(self.next_id, new + 1)
            del self.table[rid]
            self.table[new] = self.v
            self._append("u", "db.items", before, {"id": new, "v": self.v})

    def watermark(self, kind: str, window: str) -> None:
        typ = "snapshot-window-open" if kind == "open" else "snapshot-window-close"
        self._append("c", SIGNAL, None, {"id": window, "type": typ, "data": window})


class FakeChunks(ChunkReader):
    def __init__(self, db: FakeDB) -> None:
        self.db = db

    async def open(self, parallel: int) -> None:
        pass

    async def close(self) -> None:
        pass

    async def tables(self, names: list[str] | None) -> list[TableRef]:
        return [TableRef("db.items", ("id",))]

    async def estimate(self, table: TableRef) -> int:
        return len(self.db.table)

    async def chunk(
        self, table: TableRef, after: list[Any] | None, limit: int
    ) -> tuple[list[Row], list[Any] | None, bool]:
        self.db.hook()  # between the low watermark and the select
        keys = [k for k in sorted(self.db.table) if after is None or k > after[0]][: limit + 1]
        more, keys = len(keys) > limit, keys[:limit]
        rows = [{"id": k, "v": self.db.table[k]} for k in keys]
        self.db.hook()  # between the select and the high watermark
        return rows, ([keys[-1]] if keys else after), more

    async def watermark(self, kind: str, window: str) -> None:
        if kind == "open":
            self.db.hook()
        self.db.watermark(kind, window)

    def name_of(self, e: Event) -> str:
        return f"{e.source.db}.{e.source.table}"

    def is_signal(self, e: Event) -> bool:
        return self.name_of(e) == SIGNAL

    def mark_of(self, e: Event) -> tuple[str, str] | None:
        typ = (e.after or {}).get("type", "")
        return (typ.rsplit("-", 1)[1], str(e.after["data"])) if typ.startswith("snapshot-window") else None  # type: ignore[index]

    def signal_of(self, e: Event) -> list[str] | None:
        return debezium_signal(e)

    def source_info(self, table: TableRef, at: Position, ts_ms: int) -> SourceInfo:
        return SourceInfo("fake", "db", "items", at, ts_ms, None, table.key)


class FakeSource(Source):
    connector = "fake"

    def __init__(self, db: FakeDB, per_read: int) -> None:
        self.id, self.db, self.per_read, self.at = "fake", db, per_read, 0

    def chunk_reader(self, settings: SnapshotSettings) -> ChunkReader:
        return FakeChunks(self.db)

    async def open(self, resume_after: Position | None) -> None:
        resume = own_position(resume_after, SeqPosition)
        self.at = resume.seq if resume else 0

    async def read(self) -> list[Event]:
        self.db.hook()  # between reads
        out = self.db.log[self.at : self.at + self.per_read]
        self.at += len(out)
        return out

    @staticmethod
    def load_position(doc: PositionDoc) -> SeqPosition:
        return SeqPosition.from_doc(doc)


def lines(events: list[Event]) -> list[dict[str, Any]]:
    return [{"op": e.op, "before": e.before, "after": e.after} for e in events if e.op != "h"]


async def run(rows: int, chunk: int, per_read: int, writes: list[tuple[str, int]], draw: Callable[[], int],
              crashes: list[int]) -> tuple[list[Event], FakeDB]:  # fmt: skip
    """The snapshot until done and every write read; a crash after ``crashes[i]`` reads."""
    db = FakeDB(rows, writes, draw)
    source = FakeSource(db, per_read)
    ctx = PipelineContext(config(), MemoryCheckpointStore(), source, {})
    delivered: list[Event] = []
    durable: Position | None = None
    crashes = list(crashes)
    while True:
        driver = SnapshotDriver(ctx, structlog.get_logger())
        driver.settings = SnapshotSettings(mode="initial", chunk_size=chunk)
        driver.reader = FakeChunks(db)
        await driver.before_open(durable)
        await source.open(durable)
        await driver.opened(durable)
        reads = 0
        while driver.state is not None or db.writes or source.at < len(db.log):
            got = await driver.read()
            delivered += got  # the sink skips what it holds: what a resume reads is all new here
            reads += 1
            if got and reads % 3 == 0:  # a checkpoint every few reads
                durable = delivered[-1].checkpoint
                await driver.confirm(durable)
            if crashes and reads == crashes[0]:
                break
        else:
            return delivered, db
        crashes.pop(0)
        # Crash: what came after the durable checkpoint is lost; a resume reads it again.
        keep = (
            0 if durable is None else max(i + 1 for i, e in enumerate(delivered) if e.checkpoint == durable)
        )
        del delivered[keep:]
        await driver.close()


WRITES = st.lists(st.tuples(st.sampled_from(["insert", "update", "delete", "move"]), st.integers(0, 10_000)),
                  max_size=60)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 40),
    chunk=st.integers(1, 8),
    per_read=st.integers(1, 6),
    writes=WRITES,
    data=st.data(),
    crashes=st.lists(st.integers(1, 30), max_size=3),
)
def test_snapshot_rows_never_override_newer_changes(
    rows: int,
    chunk: int,
    per_read: int,
    writes: list[tuple[str, int]],
    data: st.DataObject,
    crashes: list[int],
) -> None:
    draw = lambda: data.draw(st.integers(0, 3), label="writes at a hook")  # noqa: E731
    delivered, db = anyio.run(run, rows, chunk, per_read, writes, draw, sorted(crashes))
    got = lines(delivered)
    assert replay(got) == db.table
    per_key = key_events(got)
    assert not last_not_newest(per_key)
    if not crashes:
        assert not out_of_order(per_key)
    if not crashes:  # positions only grow: sinks skip nothing they have not got
        assert all(a.order < b.order for a, b in pairwise(delivered))
        markers = [snapshot_marker(e) for e in delivered if e.op == "r"]  # Debezium's source.snapshot
        assert set(markers[:-1]) <= {"true"}
        if rows and not writes:  # with writes the last rows may be changed away inside their window
            assert markers[-1] == "last"


async def test_mode_always_snapshots_once_per_process_not_per_reconnect() -> None:
    db = FakeDB(5, [], lambda: 0)
    source = FakeSource(db, per_read=100)
    ctx = PipelineContext(config(), MemoryCheckpointStore(), source, {})
    started: list[str] = []
    durable: Position | None = None
    for _ in range(3):  # the start, then two reconnects (the reader restarts with its tree)
        driver = SnapshotDriver(ctx, structlog.get_logger())
        driver.settings = SnapshotSettings(mode="always", chunk_size=2)
        driver.reader = FakeChunks(db)
        await source.open(durable)
        await driver.opened(durable)
        if driver.state is not None and driver.state.id not in started:
            started.append(driver.state.id)
        delivered: list[Event] = []
        while driver.state is not None:
            delivered += await driver.read()
        db._write("insert", 0)  # a change after the snapshot: the checkpoint passes its last chunk
        while source.at < len(db.log):
            delivered += await driver.read()
        if delivered:
            durable = delivered[-1].checkpoint
            await driver.confirm(durable)
    assert len(started) == 1


async def test_a_chunk_read_given_up_or_cancelled_drops_its_connection() -> None:
    """A chunk read past ``query_timeout_s`` is the server unavailable, its connection dropped;
    one cancelled (a shutdown's drain given up) drops it too: left mid-query, the pool's release
    (shielded from the cancellation) waited on it, for ever on a connection gone silent."""
    dropped: list[str] = []
    with pytest.raises(SourceUnavailable, match=r"src: no answer for 0.01 s \(query_timeout_s\)"):
        await answered(anyio.sleep_forever(), 0.01, lambda: dropped.append("timed out"), "src")
    async with anyio.create_task_group() as tg:
        tg.start_soon(answered, anyio.sleep_forever(), 60, lambda: dropped.append("cancelled"), "src")
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert dropped == ["timed out", "cancelled"]
