"""Helpers for the PostgreSQL source's tests: a fresh database, a source, reading, the slot."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.postgres.config import PostgresSourceConfig
from deltaforge.sources.postgres.snapshot import PostgresChunks
from deltaforge.sources.postgres.source import PostgresSource
from tests.servers.postgres import Postgres

_n = itertools.count(1)

TYPES = """CREATE TABLE types (
    id int PRIMARY KEY, big bigint, num numeric(20,6), fl double precision, txt text, raw bytea, ok boolean,
    d date, ts timestamp(6), tstz timestamptz, u uuid, j json, jb jsonb, arr int[], tags text[], nul int
)"""
"""A table with a column of each type the change stream converts (the sources' type tests)."""


async def fresh_db(pg: Postgres) -> str:
    name = f"app{next(_n)}"
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return name


def source(pg: Postgres, db: str, **extra: Any) -> PostgresSource:
    cfg = {"id": "pg", "dsn": pg.dsn(db), "slot": f"s_{db}", "publication": f"p_{db}", **extra}
    return PostgresSource(PostgresSourceConfig.model_validate(cfg), tenant="acme")


async def opened_on(pg: Postgres, ddl: str) -> tuple[str, PostgresSource]:
    """A fresh database made by ``ddl``, and a source capturing it, opened with no checkpoint (it
    reads from now)."""
    db = await fresh_db(pg)
    conn = await asyncpg.connect(pg.dsn(db))
    await conn.execute(ddl)
    await conn.close()
    src = source(pg, db)
    await src.open(None)
    return db, src


async def read_n(src: PostgresSource, n: int, timeout: float = 60) -> list[Event]:
    out: list[Event] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < n:
        assert loop.time() < deadline, f"read {len(out)} of {n}"
        got = [e for e in await src.read() if e.op != "h"]
        out.extend(got)
        if not got:
            await asyncio.sleep(0.02)
    return out


async def slot_lsn(conn: asyncpg.Connection, slot: str) -> int:
    return int(
        await conn.fetchval("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", slot)
    )


@contextlib.asynccontextmanager
async def chunk_reader_on(
    pg: Postgres, rows: str
) -> AsyncIterator[tuple[str, asyncpg.Connection, PostgresChunks, TableRef]]:
    """A fresh database with ``t (id int PRIMARY KEY, v text)`` holding ``rows`` (a VALUES
    list), its publication, a connection to it and an open snapshot chunk reader on ``t``."""
    db = await fresh_db(pg)
    conn = await asyncpg.connect(pg.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    await conn.execute(f"INSERT INTO t VALUES {rows}")
    await conn.execute(f"CREATE PUBLICATION p_{db} FOR TABLE t")
    reader = PostgresChunks(source(pg, db), SnapshotSettings())
    await reader.open(1)
    try:
        (ref,) = await reader.tables(["public.t"])
        yield db, conn, reader, ref
    finally:
        await reader.close()
        await conn.close()
