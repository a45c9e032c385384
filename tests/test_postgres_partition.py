"""The PostgreSQL source when its server's host vanishes: a real cut of the network, where
nothing answers, keepalive probes included (``tests/servers/netns.py``), which a proxy in user
space cannot stage."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import asyncpg
import pytest

from deltaforge import tcpkeepalive
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.postgres import connections
from tests.postgres_kit import fresh_db, read_n, source
from tests.servers.netns import Link
from tests.servers.postgres import Postgres


@pytest.fixture()
def link() -> Iterator[Link]:
    with Link() as made:
        yield made


@pytest.fixture()
def far_postgres(link: Link) -> Iterator[Postgres]:
    """A PostgreSQL server on the far side of ``link``."""
    with Postgres(link) as server:
        yield server


async def test_the_control_connection_notices_a_silent_host_within_keepalives_bound(
    far_postgres: Postgres,
) -> None:
    """The questions that may rightly take hours have no timeout that tells a busy server from
    a vanished host; TCP keepalive does, within ``tcpkeepalive.bound_s()`` (25 s)."""
    conn = await connections.connect(far_postgres.dsn(), 5, "pg")
    sock = conn._transport.get_extra_info("socket")
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 25_000
    finally:
        await conn.close()


async def test_an_opening_whose_server_host_vanishes_while_the_slot_is_made_is_an_outage(
    far_postgres: Postgres, link: Link, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creating the slot waits for the transactions running then to end, for as long as they
    run, so it is bounded at a day (``slot.DECODING_S``), not by ``query_timeout_s``. The
    server's host vanishing meanwhile (cut off: nothing answers, no reset) held the opening
    for that day, the pipeline ``starting``. With keepalive the connection fails once the
    probes go unanswered: the source is unavailable, and opens once the host is back."""
    monkeypatch.setattr(tcpkeepalive, "IDLE_S", 1)
    monkeypatch.setattr(tcpkeepalive, "INTERVAL_S", 1)
    monkeypatch.setattr(tcpkeepalive, "COUNT", 2)
    db = await fresh_db(far_postgres)
    # Over the server's unix socket: no cut reaches it.
    local = await asyncpg.connect(far_postgres.local_dsn(db))
    await local.execute("CREATE TABLE t (id int PRIMARY KEY)")
    watch = await asyncpg.connect(far_postgres.local_dsn(db))  # in no transaction: fresh activity
    running = local.transaction()
    await running.start()
    await local.fetchval("SELECT txid_current()")  # a transaction the slot's creation waits for
    # Past keepalive's bound here (3 s): the question's watch from another connection
    # (watched.py), which asks every query_timeout_s, would otherwise be first to notice.
    src = source(far_postgres, db, tables=["public.t"], query_timeout_s=30)
    opening = asyncio.ensure_future(src.open(None))
    making = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event IS NOT NULL"
        " AND query LIKE 'SELECT pg_create_logical_replication_slot%'"
    )
    while not opening.done() and not await watch.fetchval(making):  # the server tells nobody
        await asyncio.sleep(0.01)
    assert not opening.done(), opening
    link.cut()
    done, _ = await asyncio.wait({opening}, timeout=60)
    link.mend()  # before any assertion: whatever is left can then be ended
    assert done, "the opening still waits, 60 s after its server's host was cut off"
    with pytest.raises(SourceUnavailable, match="the server's host stopped answering"):
        opening.result()
    await running.rollback()
    await asyncio.wait_for(src.close(), 30)
    await asyncio.wait_for(src.open(None), 30)
    await local.execute("INSERT INTO t VALUES (1)")
    assert [e.after for e in await read_n(src, 1)] == [{"id": 1}]
    await src.close()
    await local.close()
    await watch.close()
