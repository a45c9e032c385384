"""The PostgreSQL source's questions that may rightly take hours (creating a slot, moving one,
reading it at the checkpoint), watched from another connection while they run: waited for while
their backend works, given up when the server is paused or their connection went silent."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from structlog.testing import capture_logs

from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.postgres.source import PostgresSource
from tests.helpers import wait_until
from tests.postgres_kit import fresh_db, read_n, source
from tests.servers.base import paused
from tests.servers.postgres import Postgres
from tests.servers.proxy import TcpProxy

_CREATING = (
    "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_create_logical_replication_slot%' "
    "AND state = 'active' AND wait_event_type = 'Lock' AND pid <> $1"
)
"""A backend creating a slot and waiting, as that does, for the transactions running then
(other than ``$1``'s)."""


async def _tables(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int)")
    return conn


async def _behind(
    pg: Postgres, proxy: TcpProxy, query_timeout_s: float
) -> tuple[asyncpg.Connection, PostgresSource]:
    """A fresh database with the tables, a connection to it, and a source capturing ``t``
    through ``proxy``."""
    db = await fresh_db(pg)
    dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}"
    return await _tables(pg.dsn(db)), source(
        pg, db, dsn=dsn, tables=["public.t"], query_timeout_s=query_timeout_s
    )


async def _reads(conn: asyncpg.Connection, src: PostgresSource) -> None:
    """``src``, open, reads a row inserted now; then it is closed."""
    await conn.execute("INSERT INTO t VALUES (1)")
    assert [e.after for e in await read_n(src, 1)] == [{"id": 1}]
    await src.close()


async def _opening_behind(
    conn: asyncpg.Connection, src: PostgresSource, begin: bool = True, besides: int = 0
) -> tuple[asyncio.Task[None], int]:
    """``src`` opening with no slot, its slot's creation seen waiting for the transaction ``conn``
    has open (an xid given, not committed; ``begin``: opened now): the opening, and the creating
    backend's pid (not ``besides``)."""
    if begin:
        await conn.execute("BEGIN; INSERT INTO other VALUES (1)")
    opening = asyncio.create_task(src.open(None))
    # Asked on a connection of its own: a transaction sees one snapshot of pg_stat_activity.
    look = await asyncpg.connect(src.dsn)
    try:
        while not opening.done() and not (pid := await look.fetchval(_CREATING, besides)):  # no notice
            await asyncio.sleep(0.01)
    finally:
        await look.close()
    assert not opening.done(), opening
    return opening, pid


async def test_a_slot_creation_waiting_on_a_long_transaction_is_waited_for(postgres: Postgres) -> None:
    """Creating a slot waits for every transaction running then: legitimately for as long as the
    longest runs. Its watch, asking every ``query_timeout_s`` on another connection, finds its
    backend working, and the opening goes on waiting, past many checks, then opens. The watch
    names the transaction it waits for, once: the pipeline says only ``starting`` meanwhile."""
    with TcpProxy(postgres.port) as proxy, capture_logs() as logs:
        conn, src = await _behind(postgres, proxy, 0.5)
        opening, _ = await _opening_behind(conn, src)
        before = proxy.accepted
        await wait_until(lambda: proxy.accepted >= before + 4, timeout=30, what="four checks by the watch")
        assert not opening.done(), opening
        said = [e for e in logs if e["event"] == "waiting_for_transactions"]
        assert [[t["pid"] for t in e["transactions"]] for e in said] == [[conn.get_server_pid()]], said
        await conn.execute("COMMIT")
        await asyncio.wait_for(opening, 30)
        await _reads(conn, src)
    await conn.close()


async def test_a_slot_creation_outlasting_the_databases_statement_timeout_is_waited_for(
    postgres: Postgres,
) -> None:
    """A database (or role) with a ``statement_timeout``, common in production: the slot's
    creation, waiting for a transaction longer than that, was cancelled ("canceling statement due
    to statement timeout"), a crash at each attempt until the pipeline failed. The source's
    sessions turn the server's bounds off (deltaforge has its own), and it waits, then opens."""
    db = await fresh_db(postgres)
    conn = await _tables(postgres.dsn(db))
    await conn.execute(f"ALTER DATABASE \"{db}\" SET statement_timeout = '200ms'")
    await conn.execute(f"ALTER DATABASE \"{db}\" SET lock_timeout = '200ms'")
    await conn.close()
    conn = await asyncpg.connect(postgres.dsn(db))  # under the database's settings, as any client
    assert await conn.fetchval("SHOW statement_timeout") == "200ms"
    src = source(postgres, db, tables=["public.t"])
    opening, pid = await _opening_behind(conn, src)
    # Until the question has waited well past the timeout (asked afresh each time: outside a
    # transaction, on a connection of its own).
    look = await asyncpg.connect(postgres.dsn(db))
    waited = "SELECT clock_timestamp() - query_start > interval '1 s' FROM pg_stat_activity WHERE pid = $1"
    while not opening.done() and not await look.fetchval(waited, pid):
        await asyncio.sleep(0.05)
    await look.close()
    assert not opening.done(), opening
    await conn.execute("COMMIT")
    await asyncio.wait_for(opening, 30)
    await _reads(conn, src)
    await conn.close()


async def _gone(conn: asyncpg.Connection, pid: int) -> None:
    """Until the backend ``pid`` has exited."""
    while await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
        await asyncio.sleep(0.01)


async def test_a_slot_creation_whose_connection_went_silent_is_given_up_and_its_backend_ended(
    postgres: Postgres,
) -> None:
    """The connection goes silent (a middlebox holding it open, passing nothing: TCP keepalive,
    answered by the middlebox's kernel, does not notice) while the slot's creation waits; then the
    slot is made and the answer never comes. Before, the opening waited for it a day
    (``slot.DECODING_S``), the pipeline ``starting``. Now the watch finds the backend no longer
    working on it, ends it, and the opening is an outage; the next opening, over a new
    connection, finds the slot made and reads."""
    with TcpProxy(postgres.port) as proxy:
        conn, src = await _behind(postgres, proxy, 1)
        opening, pid = await _opening_behind(conn, src)
        proxy.freeze()
        await conn.execute("COMMIT")  # the slot is made; its answer stays in the frozen proxy
        with pytest.raises(
            SourceUnavailable, match=r"creating slot '[^']+': its backend is no longer working"
        ):
            await asyncio.wait_for(opening, 60)
        # Signalled (pg_terminate_backend returns once it has sent the signal): its exit follows.
        await asyncio.wait_for(_gone(conn, pid), 10)
        await asyncio.wait_for(src.close(), 30)
        await asyncio.wait_for(src.open(None), 30)
        await _reads(conn, src)
    await conn.close()


async def test_a_slot_creation_on_a_server_paused_is_an_outage_and_the_next_opening_ends_it() -> None:
    """The server paused while the slot's creation waits (SIGSTOP of every process of it, as the
    cgroup freezer behind ``docker pause`` does): its kernel still answers TCP keepalive, so the
    question's connection looks alive, and the opening waited a day. Now the watch, reaching no
    server, makes it an outage (the pipeline ``degraded``, trying again). The server resumed, the
    backend of the question given up still creates the slot (it holds it half made), waiting on
    the same transaction: the next opening ends it and makes the slot itself."""
    with Postgres() as pg:  # its own: paused, it would hold every other test's questions
        conn = await _tables(pg.dsn())
        src = source(pg, "postgres", tables=["public.t"], query_timeout_s=1)
        opening, first = await _opening_behind(conn, src, begin=True)
        pid = pg.server_pid()
        assert pid is not None
        # No connection within 10 s, or (paused mid-check) no answer on the watch's own.
        refused = r"(within 10|for 1) s.*, while creating slot '\w+' waited"
        with paused(pid), pytest.raises(SourceUnavailable, match=refused):
            await asyncio.wait_for(opening, 60)
        await asyncio.wait_for(src.close(), 30)
        reopening, _ = await _opening_behind(conn, src, begin=False, besides=first)
        # Ended, before the transaction it waits on ends: its exit (which follows the slot's
        # release the reopening waited for) looked for on a connection of its own, since a
        # transaction sees one snapshot of pg_stat_activity.
        look = await asyncpg.connect(pg.dsn())
        await asyncio.wait_for(_gone(look, first), 10)
        await look.close()
        assert not reopening.done(), reopening
        await conn.execute("COMMIT")
        await asyncio.wait_for(reopening, 30)
        await _reads(conn, src)
        await conn.close()
