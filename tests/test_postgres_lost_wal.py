"""The PostgreSQL source against a server that lost WAL it had read: restored from a copy of its
files, or crashed with ``fsync`` off. New transactions then take positions deltaforge has passed."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from structlog.testing import capture_logs

from deltaforge.events import Event
from deltaforge.snapshot.window import WATERMARK_PREFIX
from deltaforge.sources.base import PositionLost
from deltaforge.sources.postgres.pgoutput import format_lsn
from deltaforge.sources.postgres.position import PgPosition
from deltaforge.sources.postgres.source import PostgresSource
from tests.postgres_kit import read_n, slot_lsn, source
from tests.servers.postgres import Postgres


async def _insert(pg: Postgres, first: int, n: int) -> None:
    conn = await asyncpg.connect(pg.dsn())
    try:
        for i in range(first, first + n):
            await conn.execute("INSERT INTO t VALUES ($1, 'x')", i)
    finally:
        await conn.close()


async def _read_after(pg: Postgres, resume: Event | None, first: int, n: int) -> Event:
    """Open a source (from ``resume``'s checkpoint), insert ``n`` rows and read them; the last."""
    src = source(pg, "postgres", tables=["public.t"])
    await src.open(None if resume is None else resume.checkpoint)
    try:
        await _insert(pg, first, n)
        got = await read_n(src, n)
    finally:
        await src.close()
    assert [e.after["id"] for e in got if e.after] == list(range(first, first + n))
    return got[-1]


async def _two_rows_then_a_copy(pg: Postgres) -> tuple[Event, Path]:
    """Table ``t`` and two rows read (the last of them); then a copy of the server's files, taken
    with the server stopped (what a disk snapshot of a crashed machine holds)."""
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    await conn.close()
    first = await _read_after(pg, None, 1, 2)
    pg.halt()
    copy = pg.copy_files()
    pg.resume()
    return first, copy


async def test_a_checkpoint_past_the_end_of_a_restored_servers_wal_is_position_lost() -> None:
    """The server is restored from a copy of its files (a disk snapshot) taken before the last
    changes deltaforge delivered, and takes two new rows. Their WAL lies before the checkpoint:
    moving the slot there stopped at the WAL's end without a word, and both rows were skipped as
    delivered ("read 0 of 2"). Now the opening halts, saying so."""
    with Postgres() as pg:
        first, copy = await _two_rows_then_a_copy(pg)
        last = await _read_after(pg, first, 3, 20)
        pg.halt()
        pg.restore_files(copy)
        pg.resume()
        await _insert(pg, 100, 2)
        again = source(pg, "postgres", tables=["public.t"])
        with pytest.raises(PositionLost, match=r"^position lost: the server's WAL ends at [0-9A-F/]+, before the "
                           r"checkpoint [0-9A-F/]+: it lost WAL .*Re-snapshot required\.$"):  # fmt: skip
            await again.open(last.checkpoint)
        # Nothing is lost on the server: from a checkpoint it still has (the copy's), the rows
        # written since the restore are read.
        src = source(pg, "postgres", tables=["public.t"])
        await src.open(first.checkpoint)
        got = await read_n(src, 2)
        await src.close()
        assert [e.after["id"] for e in got if e.after] == [100, 101]


async def _other_wal_until(conn: asyncpg.Connection, lsn: int) -> int:
    """Rows of a table the source does not read (pgoutput sends none of those transactions) until
    the server's WAL reaches ``lsn``; where it ends."""
    await conn.execute("CREATE TABLE IF NOT EXISTS other (id int, pad text)")
    while (now := int(await conn.fetchval("SELECT pg_current_wal_flush_lsn()"))) < lsn:
        await conn.execute("INSERT INTO other SELECT g, repeat('p', 200) FROM generate_series(1, 500) g")
    return now


async def _beat_past(pg: Postgres, src: PostgresSource, wal: int) -> Event:
    """At least ``wal`` bytes of WAL of a table the source does not read, then the source's first
    heartbeat past it: an idle pipeline's checkpoint."""
    conn = await asyncpg.connect(pg.dsn())
    now = await _other_wal_until(conn, int(await conn.fetchval("SELECT pg_current_wal_flush_lsn()")) + wal)
    while not (beats := [e for e in await src.read() if e.op == "h" and e.checkpoint.lsn > now]):  # type: ignore[attr-defined]
        await conn.execute("INSERT INTO other VALUES (0, '')")  # moves the WAL's end: a heartbeat follows
    await conn.close()
    return beats[-1]


async def _heartbeat_after(pg: Postgres, resume: Event, first: int, n: int) -> Event:
    """Like ``_read_after``, then WAL of a table the source does not read, until a heartbeat: its
    checkpoint is what an idle pipeline holds."""
    src = source(pg, "postgres", tables=["public.t"], heartbeat_ms=50)
    await src.open(resume.checkpoint)
    try:
        await _insert(pg, first, n)
        got = await read_n(src, n)
        beats = [await _beat_past(pg, src, 0)]
    finally:
        await src.close()
    beat = beats[-1].checkpoint
    assert beat.last_commit == (got[-1].order[0], got[-1].checkpoint.commit_ts)  # type: ignore[attr-defined]
    return beats[-1]


@pytest.mark.parametrize("held", ["transaction", "heartbeat"])
async def test_a_restored_server_whose_new_wal_passed_the_checkpoint_is_position_lost(held: str) -> None:
    """As above, but the restored server takes rows until its WAL reaches past the checkpoint: the
    WAL-end check no longer sees the restore, and moving the slot to the checkpoint skipped the new
    rows as delivered. Probed: the restored server wrote a COMMIT at the checkpoint's very commit
    and end LSN; only its commit time differed, and checkpoints now carry it (a heartbeat's, an
    idle pipeline's, the last transaction's before it). On the server before the restore the same
    checkpoint opens: its commit is found there, with its time."""
    with Postgres() as pg:
        first, copy = await _two_rows_then_a_copy(pg)
        last = await (
            _read_after(pg, first, 3, 20) if held == "transaction" else _heartbeat_after(pg, first, 3, 20)
        )
        assert last.checkpoint.last_commit is not None  # type: ignore[attr-defined]
        healthy = source(pg, "postgres", tables=["public.t"])
        await healthy.open(last.checkpoint)  # the slot is behind the commit (nothing confirmed it): checked
        await healthy.close()
        pg.halt()
        pg.restore_files(copy)
        pg.resume()
        conn = await asyncpg.connect(pg.dsn())
        past = "SELECT pg_current_wal_flush_lsn() > $1::text::pg_lsn"
        row = 100
        while not await conn.fetchval(past, format_lsn(last.checkpoint.lsn)):  # type: ignore[attr-defined]
            await conn.execute("INSERT INTO t VALUES ($1, 'x')", row)
            row += 1
        await conn.close()
        again = source(pg, "postgres", tables=["public.t"])
        # The heartbeat is quiet: the rows written after the restore before it are named first
        with pytest.raises(PositionLost, match=r"^position lost: the server's WAL (at the checkpoint's transaction "
                           r"\(commit [0-9A-F/]+, committed 20[-0-9T:.+]+\) holds (a transaction committed "
                           r"20[-0-9T:.+]+|no transaction of the publication)|holds a transaction committed "
                           r"20[-0-9T:.+]+ at [0-9A-F/]+, between the last transaction deltaforge read \(commit "
                           r"[0-9A-F/]+, committed 20[-0-9T:.+]+\) and its checkpoint [0-9A-F/]+, where the server "
                           r"had none): it lost WAL .*Re-snapshot required\.$"):  # fmt: skip
            await again.open(last.checkpoint)


async def _two_rows_read(pg: Postgres) -> tuple[asyncpg.Connection, PostgresSource, Event]:
    """Table ``t``, a connection, an open source reading ``t`` (a heartbeat every 50 ms) and the
    last of two rows it read."""
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src = source(pg, "postgres", tables=["public.t"], heartbeat_ms=50)
    await src.open(None)
    await _insert(pg, 1, 2)
    return conn, src, (await read_n(src, 2))[-1]


@pytest.mark.parametrize("slot", ["past the last transaction", "where the server left it"])
async def test_a_server_restored_from_a_copy_taken_while_idle_is_position_lost(slot: str) -> None:
    """The copy is taken while the pipeline idles, after its last transaction; the server's WAL then
    moves on (other tables), and the idle pipeline's checkpoint with it. Restored, the server takes
    rows at positions before that checkpoint, and its WAL passes it. The checkpoint's transaction
    is on the restored server, with its time (the copy holds it), or behind the slot: moving the
    slot to the checkpoint skipped the rows as delivered. A quiet heartbeat says no transaction
    committed between the last one and itself, and the slot shows the new ones there. The copy's
    slot is past the last transaction when the pipeline restarted before the copy (an opening
    moves the slot to the checkpoint, and the server keeps that); otherwise where the server last
    saved it (PostgreSQL 15 does not save a confirmation alone at shutdown)."""
    with Postgres() as pg:
        conn, src, last = await _two_rows_read(pg)
        idle = await _beat_past(pg, src, 0)
        await src.close()
        if slot == "past the last transaction":
            restarted = source(pg, "postgres", tables=["public.t"])
            await restarted.open(idle.checkpoint)
            await restarted.close()
        pg.halt()
        copy = pg.copy_files()
        pg.resume()
        src = source(pg, "postgres", tables=["public.t"], heartbeat_ms=50)
        await src.open(idle.checkpoint)
        beat = await _beat_past(pg, src, 1 << 20)
        await src.close()
        cp: PgPosition = beat.checkpoint  # type: ignore[assignment]
        assert cp.quiet == 1 and cp.last_commit == (last.order[0], last.checkpoint.commit_ts)  # type: ignore[attr-defined]
        healthy = source(pg, "postgres", tables=["public.t"])
        await healthy.open(cp)  # the slot is past the last transaction: the quiet check runs, and passes
        await healthy.close()
        await conn.close()
        pg.halt()
        pg.restore_files(copy)
        pg.resume()
        await _insert(pg, 100, 2)  # at positions between the copy's slot and the checkpoint
        conn = await asyncpg.connect(pg.dsn())
        await _other_wal_until(conn, cp.lsn + 1)
        if slot == "past the last transaction":
            assert await slot_lsn(conn, "s_postgres") > last.order[0]
        await conn.close()
        again = source(pg, "postgres", tables=["public.t"])
        with pytest.raises(PositionLost, match=r"^position lost: the server's WAL holds a transaction committed "
                           r"20[-0-9T:.+]+ at [0-9A-F/]+, between the last transaction deltaforge read \(commit "
                           r"[0-9A-F/]+, committed 20[-0-9T:.+]+\) and its checkpoint [0-9A-F/]+, where the server "
                           r"had none: it lost WAL .*Re-snapshot required\.$"):  # fmt: skip
            await again.open(cp)


async def test_a_quiet_heartbeat_names_the_transactions_deltaforge_does_not_hand_out() -> None:
    """Transactions the stream sends and deltaforge hands nothing of (another application's logical
    message) are commits the slot shows too: a quiet heartbeat's last transaction is the last of
    any, or a healthy server would be taken for a restored one."""
    with Postgres() as pg:
        conn, src, last = await _two_rows_read(pg)
        await conn.execute("SELECT pg_logical_emit_message(true, 'another.app', 'hello')")
        beat = await _beat_past(pg, src, 0)
        await src.close()
        cp: PgPosition = beat.checkpoint  # type: ignore[assignment]
        assert cp.quiet == 1 and cp.last_commit is not None and cp.last_commit[0] > last.order[0]
        again = source(pg, "postgres", tables=["public.t"])
        await again.open(cp)
        await again.close()
        await conn.close()


async def test_a_checkpoint_at_a_transaction_holding_only_a_snapshot_watermark_opens() -> None:
    """A snapshot's watermark is a transaction holding only a logical message, and checkpoints
    name it. Read without the stream's ``messages`` option, the slot had no COMMIT for it, and a
    healthy server was taken for a restored one (a snapshot killed mid-way then halted as
    position lost)."""
    with Postgres() as pg:
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        src = source(pg, "postgres", tables=["public.t"])
        await src.open(None)
        try:
            await conn.execute("SELECT pg_logical_emit_message(true, $1, 'open:w1')", WATERMARK_PREFIX)
            while not (marks := [e for e in await src.read() if e.op == "m"]):
                pass  # each read waits for the stream (up to poll_interval_ms)
        finally:
            await src.close()
        await conn.close()
        mark = marks[0].checkpoint
        assert mark.last_commit is not None  # type: ignore[attr-defined]  # so it is checked
        again = source(pg, "postgres", tables=["public.t"])
        await again.open(mark)
        await again.close()


async def test_fsync_off_is_named_at_every_opening() -> None:
    """``fsync`` off makes the WAL deltaforge reads something a crash of the machine can take back
    (the case above): named at each opening, as a warning, and not once it is on."""
    with Postgres() as pg:  # the test servers run with fsync off
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        said: list[list[str]] = []
        for _ in range(2):
            with capture_logs() as logs:
                src = source(pg, "postgres", tables=["public.t"])
                await src.open(None)
                await src.close()
            said.append([e["risk"] for e in logs if e["event"] == "source_durability"])
        assert [len(s) for s in said] == [1, 1] and said[0][0].startswith("fsync is off: ")
        await conn.execute("ALTER SYSTEM SET fsync = on")
        await conn.execute("SELECT pg_reload_conf()")
        with capture_logs() as logs:
            src = source(pg, "postgres", tables=["public.t"])
            await src.open(None)
            await src.close()
        assert [e for e in logs if e["event"] == "source_durability"] == []
        await conn.close()
