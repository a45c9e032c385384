"""The PostgreSQL source against a server that lost WAL it had read: restored from a copy of its
files, or crashed with ``fsync`` off. New transactions then take positions deltaforge has passed."""

from __future__ import annotations

import asyncpg
import pytest
from structlog.testing import capture_logs

from deltaforge.events import Event
from deltaforge.sources.base import PositionLost
from tests.postgres_kit import read_n, source
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


async def test_a_checkpoint_past_the_end_of_a_restored_servers_wal_is_position_lost() -> None:
    """The server is restored from a copy of its files (a disk snapshot) taken before the last
    changes deltaforge delivered, and takes two new rows. Their WAL lies before the checkpoint:
    moving the slot there stopped at the WAL's end without a word, and both rows were skipped as
    delivered ("read 0 of 2"). Now the opening halts, saying so."""
    with Postgres() as pg:
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        await conn.close()
        first = await _read_after(pg, None, 1, 2)
        pg.halt()
        copy = pg.copy_files()
        pg.resume()
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
