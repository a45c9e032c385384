"""The PostgreSQL source meeting faults: a half-open network, a damaged WAL record."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from chaos.harness import ProxyServer, port_of
from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import SourceError, SourceUnavailable
from deltaforge.sources.postgres import slot as slot_ops
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from tests.helpers import damage_on_disk, jsonl, wait_until, wait_until_sync
from tests.kit import NeverDurable, ScriptedSink
from tests.postgres_kit import fresh_db, read_n, source
from tests.serve_proc import serve_pipeline
from tests.servers.postgres import Postgres
from tests.servers.proxy import TcpProxy
from tests.stopped_decoder import stopped_decoder_is_replaced


async def test_a_half_open_network_is_unavailable_not_a_silent_stall(
    postgres: Postgres, proxies: ProxyServer
) -> None:
    """The network stops passing anything and closes nothing (a dead route, a firewall dropping
    packets). The stream asks for keepalives while it waits; none answered for
    ``receiver_timeout_ms`` means the connection is lost (PostgreSQL's own receivers' rule),
    where before it waited on a socket that would never speak again, the pipeline saying ok.
    The server here never times the stream out itself (``wal_sender_timeout = 0`` for the role),
    so nothing but the stream's own rule can notice."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    role = f"quiet_{db}"
    await conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER REPLICATION")
    await conn.execute(f"ALTER ROLE {role} SET wal_sender_timeout = 0")
    proxy = proxies.proxy("pg", f"127.0.0.1:{postgres.port}")
    dsn = f"postgresql://{role}@127.0.0.1:{port_of(proxy)}/{db}"
    src = source(postgres, db, dsn=dsn, receiver_timeout_ms=3000)
    await src.open(None)
    await conn.execute("INSERT INTO t VALUES (1)")
    await read_n(src, 1)
    for stream in ("downstream", "upstream"):
        proxy.add_toxic(name=f"hole_{stream}", type="timeout", stream=stream, attributes={"timeout": 0})
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(SourceUnavailable, match="nothing from the server for 3 s"):
        while loop.time() - began < 60:
            await src.read()
    for stream in ("downstream", "upstream"):
        proxy.destroy_toxic(f"hole_{stream}")
    await src.close()
    await conn.close()


async def test_closing_a_source_whose_connections_went_silent_never_fails(
    postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the source on the way to its next opening, after every connection went silent
    for good (its host vanished, a NAT forgot them): the control connection answers neither the
    wait for the slot's release nor its goodbye, and the close raised TimeoutError, which the
    reader's exit carried in place of the outage: a crash, counted. Nor is the release waited
    for on a connection that does not answer (it was, for ``RELEASE_S``: a shutdown then took
    that long after its drain)."""
    monkeypatch.setattr(slot_ops, "RELEASE_S", 3600.0)
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with TcpProxy(postgres.port) as proxy:
        src = source(postgres, db, dsn=f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}")
        await src.open(None)
        await conn.execute("INSERT INTO t VALUES (1)")
        await read_n(src, 1)
        proxy.freeze()
        await asyncio.wait_for(src.close(), 60)  # not the hour the release may take
    await conn.close()


async def test_a_catalog_connection_a_nat_forgot_while_idle_is_not_asked_again(postgres: Postgres) -> None:
    """The decoder's catalog connection idles between tables' first changes, and a NAT or
    firewall forgets an idle connection: a lookup asked on it (a new table's key) waited for
    ever, the stream unread meanwhile and ``/health`` ok. One idle longer than the stream's own
    silence bound (``receiver_timeout_ms``) is opened anew before it is asked."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t1 (id int PRIMARY KEY)")
    with TcpProxy(postgres.port) as proxy:
        dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}"
        # The stream asks for a keepalive every 0.2 s: it is never idle long enough to be forgotten.
        src = source(postgres, db, dsn=dsn, heartbeat_ms=200, receiver_timeout_ms=1000)
        await src.open(None)
        await conn.execute("INSERT INTO t1 VALUES (1)")
        await read_n(src, 1)
        proxy.forget_idle(1.5)
        # The decoder's catalog connection and the source's control connection (a check every 5 s).
        await wait_until(lambda: proxy.forgotten >= 2, timeout=30, what="the idle connections forgotten")
        await conn.execute("CREATE TABLE t2 (id int PRIMARY KEY)")
        await conn.execute("INSERT INTO t2 VALUES (2)")
        got = await read_n(src, 1, timeout=30)
        assert [(e.source.table, e.after) for e in got] == [("t2", {"id": 2})]
        await src.close()
    await conn.close()


async def test_a_control_connection_gone_silent_while_opening_is_given_up(postgres: Postgres) -> None:
    """The opening asks its questions (the slot, the publication, the checkpoint's checks) on
    the control connection, which had no timeout: one that went silent for good mid-opening
    (the server's host vanished as the pipeline reconnected after an outage, the likeliest time
    for it) held the opening for ever, the pipeline ``starting``. Staged: the opening's
    ``CREATE PUBLICATION`` waits on a table lock; the proxy freezes; the lock goes. It must be
    given up after ``query_timeout_s`` and the next opening go over a new connection."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with TcpProxy(postgres.port) as proxy:
        dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}"
        src = source(postgres, db, dsn=dsn, tables=["public.t"], query_timeout_s=3)
        lock = conn.transaction()
        await lock.start()
        await conn.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        opening = asyncio.ensure_future(src.open(None))
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 't'::regclass"
        while not opening.done() and not await conn.fetchval(waiting):  # the server has no notice of it
            await asyncio.sleep(0.01)
        assert not opening.done(), opening
        proxy.freeze()
        await lock.rollback()
        with pytest.raises(SourceUnavailable, match=r"no answer for 3 s \(query_timeout_s\)"):
            await asyncio.wait_for(opening, 30)
        await asyncio.wait_for(src.close(), 30)
        await asyncio.wait_for(src.open(None), 30)  # over a new connection
        await conn.execute("INSERT INTO t VALUES (1)")
        assert [e.after for e in await read_n(src, 1)] == [{"id": 1}]
        await src.close()
    await conn.close()


async def test_describing_the_tables_of_a_server_that_is_down_is_an_outage_not_an_error(
    postgres: Postgres,
) -> None:
    """A Spark transformer starting asks the source to describe its tables: with the server down
    (a restart of the pipeline's actors during an outage) that was an error, ``cannot
    connect``, so a crash counted against the pipeline's restarts, where every other question
    to a server that is down is an outage, waited out."""
    db = await fresh_db(postgres)
    with TcpProxy(postgres.port) as proxy:
        src = source(postgres, db, dsn=f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}")
        proxy.down()
        with pytest.raises(SourceUnavailable):
            await src.describe_tables()
        proxy.up()
        assert await src.describe_tables() == []


async def test_a_check_on_a_control_connection_a_nat_forgot_is_given_up(postgres: Postgres) -> None:
    """The publication, partition and slot checks run every 5 s on the control connection. One
    a NAT forgot between two checks answered nothing, the check waited for ever, and no check
    ran again, said by nothing: a table taken out of the publication then went unnoticed. The
    check unanswered within ``query_timeout_s`` makes the source unavailable: it is opened
    again over a new connection, its checks with it."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with TcpProxy(postgres.port) as proxy:
        dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/{db}"
        # The stream asks for a keepalive every 0.2 s: it is never idle long enough to be forgotten.
        src = source(postgres, db, dsn=dsn, heartbeat_ms=200, receiver_timeout_ms=1000, query_timeout_s=2)
        await src.open(None)
        await conn.execute("INSERT INTO t VALUES (1)")
        await read_n(src, 1)
        proxy.forget_idle(1.5)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(SourceUnavailable, match=r"its control connection: no answer for 2 s"):
            while loop.time() - began < 60:
                await src.read()
        assert proxy.forgotten >= 1
        await asyncio.wait_for(src.close(), 30)
    await conn.close()


def test_a_catalog_question_whose_connection_goes_silent_is_asked_again_on_a_new_one(
    postgres: Postgres,
) -> None:
    """The decoder's catalog questions (a new table's key, a type) block its one thread, the
    stream's too, and psycopg's wait has no timeout: a connection that went silent mid-question
    (its host vanished, a NAT forgot it while busy) held the stream for ever, ``/health`` ok.
    Past the silence bound the connection is cut and the question asked on a new one."""
    import threading

    import psycopg

    from deltaforge.sources.postgres.catalog import Catalog

    with TcpProxy(postgres.port) as proxy:
        catalog = Catalog(f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres", idle_s=2)
        got: list[object] = []
        asking = threading.Thread(target=lambda: got.append(catalog.rows("SELECT 7 FROM pg_sleep(1)", ())))
        asking.start()
        with psycopg.connect(postgres.dsn(), autocommit=True) as watcher:
            asked = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT 7 FROM pg_sleep%'"
            while watcher.execute(asked).fetchone() == (0,):  # the server has no notice of it
                pass
        proxy.freeze()
        asking.join(30)
        assert not asking.is_alive(), "the question waited on the silent connection"
    assert got == [[(7,)]]


def test_connections_gone_silent_for_good_are_waited_out_not_taken_for_a_crash(
    postgres: Postgres, tmp_path: Path
) -> None:
    """Every connection to the source goes silent for good (its host vanished, a NAT forgot
    them; new ones pass). The stream notices (``receiver_timeout_ms``) and the source is
    unavailable; closing it on the way to the next opening must not fail on the control
    connection, which answers neither its query nor its goodbye: that failure stood in for the
    outage, the reader's exit was judged a crash, counted against the restart intensity (a few
    such in a row fail the pipeline). The server does not notice the silent stream either
    (``wal_sender_timeout`` 0 here: never; a minute by default), and that stream's walsender
    held the slot against the next one, for ever: it is this source's own, and is ended."""
    _silent_stream_is_ended(postgres, tmp_path, payload=0, within_s=90)


def test_a_silent_streams_walsender_blocked_on_its_full_socket_is_ended_at_once(
    postgres: Postgres, tmp_path: Path
) -> None:
    """As above, but the silent stream's walsender had more to send than the connection took
    (a snapshot's or a busy table's changes): blocked writing, it spent the first
    ``pg_terminate_backend`` on sending its "terminating connection" error and stayed blocked
    there, holding the slot (seen over two minutes on PostgreSQL 15). The opening waited a
    minute for it, failed, and the next one ended it again. A second signal ends it: the
    opening signals it again each second until it lets go, and the rows arrive without that
    minute."""
    _silent_stream_is_ended(postgres, tmp_path, payload=1000, within_s=30)


def _silent_stream_is_ended(postgres: Postgres, tmp_path: Path, payload: int, within_s: float) -> None:
    """The pipeline's connections frozen after its first 10 rows, 10 more written (each with
    ``payload`` bytes, 20,000 rows more when it is not 0: more than the frozen connection's
    buffers take); every row arrives within ``within_s`` without a crash, the stale walsender
    ended once."""
    db = asyncio.run(fresh_db(postgres))
    role = f"brief_{db}"

    async def setup() -> None:
        conn = await asyncpg.connect(postgres.dsn(db))
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, p text)")
        await conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER REPLICATION")
        # The server never times the silent stream's walsender out (the default: after a
        # minute): it holds the slot until deltaforge ends it, the walsender of its own stream.
        await conn.execute(f"ALTER ROLE {role} SET wal_sender_timeout = 0")
        await conn.close()

    async def insert(first: int, n: int) -> None:
        """Rows ``first`` on, in transactions of 50: a walsender blocked amid many transactions
        is the one a first signal does not end (amid one large one, it does)."""
        conn = await asyncpg.connect(postgres.dsn(db))
        for at in range(first, first + n, 50):
            last = min(at + 50, first + n) - 1
            await conn.execute(
                "INSERT INTO t SELECT g, repeat('x', $3) FROM generate_series($1::int, $2::int) g",
                at,
                last,
                payload,
            )
        await conn.close()

    async def walsender_writing() -> bool:
        """The stream's walsender is waiting for its connection to take more."""
        conn = await asyncpg.connect(postgres.dsn())
        try:
            asked = "SELECT 1 FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'WalSenderWriteData'"
            return bool(await conn.fetchval(asked, role))
        finally:
            await conn.close()

    asyncio.run(setup())
    out, log = tmp_path / "out.jsonl", tmp_path / "log.jsonl"
    rows = 20 + (20_000 if payload else 0)
    with TcpProxy(postgres.port) as proxy:
        config = {"id": "pg", "dsn": f"postgresql://{role}@127.0.0.1:{proxy.port}/{db}", "slot": f"s_{db}",
                  "publication": f"p_{db}", "receiver_timeout_ms": 3000, "query_timeout_s": 2}  # fmt: skip
        spec = {"source": {"type": "postgres", "config": config},
                "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}]}  # fmt: skip
        with serve_pipeline(tmp_path, spec) as serve:
            asyncio.run(insert(1, 10))
            wait_until_sync(lambda: len(jsonl(out)) == 10, timeout=30, what="the first rows")
            proxy.freeze()
            asyncio.run(insert(11, rows - 10))
            if payload:  # the case this stages: the walsender blocked on the frozen connection
                wait_until_sync(lambda: asyncio.run(walsender_writing()), timeout=3, what="walsender blocked")
            wait_until_sync(
                lambda: len(jsonl(out)) >= rows, timeout=within_s, what="the rows written after the freeze"
            )
            assert serve.terminate() == 0
    assert {r["after"]["id"] for r in jsonl(out)} == set(range(1, rows + 1))
    restarts = [r for r in jsonl(log) if r["event"] == "child_restarted" and r["failed"] == "SourceReader"]
    assert restarts, "the source was never opened again"
    crashes = [r["reason"] for r in restarts if not r["reason"].startswith("SourceUnavailable")]
    assert not crashes, crashes
    ended = [r for r in jsonl(log) if r["event"] == "stale_walsender_ended"]
    assert len(ended) == 1, ended


def test_a_stopped_decoder_process_is_replaced_and_nothing_is_lost(
    postgres: Postgres, tmp_path: Path
) -> None:
    """The decoder child stopped (SIGSTOP, a cgroup freezer): it said nothing, the parent took
    that for a quiet server, and the pipeline read nothing more, for ever, with ``/health`` ok.
    Past the stream's silence bound plus a slack (``receiver_timeout_ms`` 1 s + 10 s here) the
    reader fails naming it, its restart starts another child, and the rows written meanwhile
    arrive."""
    db = asyncio.run(fresh_db(postgres))

    async def sql(statement: str) -> None:
        conn = await asyncpg.connect(postgres.dsn(db))
        await conn.execute(statement)
        await conn.close()

    asyncio.run(sql("CREATE TABLE t (id int PRIMARY KEY)"))
    config = {"id": "pg", "dsn": postgres.dsn(db), "slot": f"s_{db}", "publication": f"p_{db}",
              "receiver_timeout_ms": 1000}  # fmt: skip
    stopped_decoder_is_replaced(
        tmp_path,
        {"type": "postgres", "config": config},
        lambda first, last: asyncio.run(sql(f"INSERT INTO t SELECT generate_series({first}, {last})")),
        bound_s=11,
    )


async def test_a_connection_lost_before_the_first_checkpoint_reads_everything_again(
    postgres: Postgres,
) -> None:
    """The stream breaks (its walsender terminated) before any checkpoint is durable. The restart
    drops what was in flight, so the next opening must start where the slot is, not after what
    the last one handed out: rows 1-3 come again (at least once), nothing is skipped."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    ids: list[int] = []
    sink = ScriptedSink("a", script=lambda _n, events: ids.extend(e.after["id"] for e in events if e.after))
    doc = {
        "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "early"},
        "spec": {"source": {"type": "postgres", "config": {"id": "pg", "dsn": postgres.dsn(db), "slot": f"s_{db}",
                                                           "publication": f"p_{db}"}},
                 "sinks": [{"type": "stdout", "config": {"id": "a"}}],
                 "supervision": {"max_restarts": 50, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 20}}},
    }  # fmt: skip
    runner = PipelineRunner(
        parse_pipeline(doc, env={}), store=NeverDurable(sink_key("pg", "a")), sinks={"a": sink}
    )
    task = asyncio.create_task(runner.run())

    def reader_running() -> bool:
        reader = runner.snapshot().find("SourceReader")
        return reader is not None and reader.state == "running"  # so the slot exists

    await wait_until(reader_running, timeout=60, what="the source open")
    for i in (1, 2, 3):
        await conn.execute("INSERT INTO t VALUES ($1)", i)
    await wait_until(lambda: ids == [1, 2, 3], what="rows 1-3 delivered")
    await conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
                       f"s_{db}")  # fmt: skip
    await wait_until(
        lambda: runner.ctx.epoch > 1 and reader_running(), timeout=60, what="the source reopened"
    )
    for i in (4, 5):
        await conn.execute("INSERT INTO t VALUES ($1)", i)
    await wait_until(lambda: 5 in ids, timeout=60, what="row 5 delivered")
    runner.stop_now()
    await asyncio.gather(task, return_exceptions=True)
    await conn.close()
    assert ids == [1, 2, 3, 1, 2, 3, 4, 5]


async def _damage_the_wal_after_row_1(pg: Postgres) -> str:
    """A database whose slot (created first) has rows 1 and 2 to read, row 2's WAL record damaged
    on disk: a byte changed in its closed WAL segment."""
    db = await fresh_db(pg)
    conn = await asyncpg.connect(pg.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
    src = source(pg, db)
    await src.open(None)  # the slot starts here
    await src.close()
    await conn.execute("INSERT INTO t VALUES (1, 'plain')")
    await conn.execute("INSERT INTO t VALUES (2, 'the original note')")
    segment = pg.data / "pg_wal" / await conn.fetchval("SELECT pg_walfile_name(pg_current_wal_lsn())")
    await conn.execute("SELECT pg_switch_wal()")  # that segment is closed: nothing writes it again
    await conn.close()
    damage_on_disk(segment, b"the original note")
    return db


def test_a_damaged_wal_record_ends_the_stream_after_what_came_before_as_an_error() -> None:
    """A byte changed in a closed WAL segment on the server's disk: PostgreSQL's own CRC check
    refuses the record. The source hands over the transaction before it, then fails naming the
    record's LSN: an error (the pipeline halts after its restarts), never "unavailable" (waiting
    cannot mend it), and the damaged row is never delivered."""

    async def scenario(pg: Postgres) -> tuple[list[Event], BaseException]:
        src = source(pg, await _damage_the_wal_after_row_1(pg))
        await src.open(None)
        seen: list[Event] = []
        try:
            with pytest.raises(SourceError) as info:
                while len(seen) < 2:  # the damaged row, delivered, ends it too
                    got = [e for e in await src.read() if e.op != "h"]
                    seen.extend(got)
                    if not got:
                        await asyncio.sleep(0.02)
            return seen, info.value
        finally:
            await src.close()

    with Postgres() as pg:
        seen, error = asyncio.run(scenario(pg))
    assert [e.after for e in seen] == [{"id": 1, "note": "plain"}]
    assert not isinstance(error, SourceUnavailable)
    assert "incorrect resource manager data checksum in record at" in str(error)


def test_a_pipeline_meeting_a_damaged_wal_record_halts_saying_where(tmp_path: Path) -> None:
    """Through the pipeline: row 1 is delivered, the source restarts (in case it was the
    connection), then the pipeline halts naming the record; row 2 never arrives."""
    out = tmp_path / "events.jsonl"

    async def scenario(pg: Postgres) -> tuple[str, str | None]:
        db = await _damage_the_wal_after_row_1(pg)
        doc = {
            "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "wal"},
            "spec": {"source": {"type": "postgres", "config": {"id": "pg", "dsn": pg.dsn(db), "slot": f"s_{db}",
                                                               "publication": f"p_{db}"}},
                     "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}]},
        }  # fmt: skip
        runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore())
        task = asyncio.create_task(runner.run())

        def ids() -> list[int]:
            return [e["after"]["id"] for e in jsonl(out)] if out.exists() else []

        await wait_until(lambda: task.done() or len(ids()) > 1, timeout=120, what="a halt (or row 2)")
        if not task.done():  # the damaged row was delivered: stop, then fail below
            await runner.drain()
            await task
        assert ids() == [1]
        return runner.state, runner.failure

    with Postgres() as pg:
        state, failure = asyncio.run(scenario(pg))
    assert state == "failed"
    assert failure is not None and "incorrect resource manager data checksum in record at" in failure


async def test_the_decoders_catalog_connection_closed_while_idle_is_opened_again(postgres: Postgres) -> None:
    """The decoder child asks the catalog (a connection of its own) for a table's primary key and
    column types when a table's first change arrives; between such changes it idles, and a server
    closes idle sessions (``idle_session_timeout``, or a DBA's clean-up): the next new table's
    first change failed the stream as ``IdleSessionTimeout``/``AdminShutdown``, a source error and
    a restart with a traceback. It is opened again and asked once more."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
    src = source(postgres, db)
    await src.open(None)
    try:
        await conn.execute("INSERT INTO a VALUES (1)")
        assert [e.after for e in await read_n(src, 1)] == [{"id": 1}]
        catalog = (
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'deltaforge decoder'"
        )
        pid = await conn.fetchval(catalog, db)
        assert pid is not None
        await conn.execute("SELECT pg_terminate_backend($1, 10000)", pid)  # returns once it is gone
        await conn.execute("CREATE TABLE b (id int PRIMARY KEY, n numeric)")
        await conn.execute("INSERT INTO b VALUES (2, 2.5)")
        [ev] = await read_n(src, 1)
        assert (ev.source.table, ev.after, ev.source.key) == ("b", {"id": 2, "n": Decimal("2.5")}, ("id",))
    finally:
        await src.close()
        await conn.close()


async def test_a_slot_another_reader_holds_is_said_and_waited_for_not_a_silent_stall(
    postgres: Postgres,
) -> None:
    """Two pipelines given one slot (the default ``deltaforge`` for both: two teams' configs on one
    database): the second cannot stream while the first does. It is listed unavailable within
    seconds, saying who holds the slot and what to set, delivers nothing, and streams once the
    slot is free. Before, it waited a minute without a word (``/health`` ok, nothing read),
    then crashed with a traceback, again and again."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")

    def pipeline(name: str) -> PipelineRunner:
        doc = {
            "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": name},
            "spec": {"source": {"type": "postgres", "config": {"id": "pg", "dsn": postgres.dsn(db), "slot": f"s_{db}",
                                                               "publication": f"p_{db}"}},
                     "sinks": [{"type": "stdout", "config": {"id": "a"}}],
                     "supervision": {"max_restarts": 5, "within_seconds": 60, "backoff": {"base_ms": 100, "max_ms": 1000}}},
        }  # fmt: skip
        return PipelineRunner(
            parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), sinks={"a": ScriptedSink("a")}
        )

    first, second = pipeline("billing"), pipeline("search")
    tasks = [asyncio.create_task(first.run())]
    try:
        await wait_until(lambda: (r := first.snapshot().find("SourceReader")) is not None and r.state == "running",
                         timeout=60, what="the first source open")  # fmt: skip
        await conn.execute("INSERT INTO t VALUES (1)")
        await wait_until(lambda: first.ctx.stats.events_committed >= 1, what="the first streaming")
        tasks.append(asyncio.create_task(second.run()))

        def said() -> str:
            return str(second.ctx.availability.view().get("source", {}).get("last_error", ""))

        await wait_until(lambda: "is in use" in said() or second.state == "failed", timeout=30,
                         what="the second listed unavailable")  # fmt: skip
        reason = said()
        holder = await conn.fetchval(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", f"s_{db}"
        )
        assert f"replication slot 's_{db}' is in use by pid {holder}" in reason, reason
        assert "spec.source.config.slot" in reason
        await conn.execute("INSERT INTO t VALUES (2)")
        await wait_until(lambda: first.ctx.stats.events_committed >= 2, what="the first delivering")
        assert second.ctx.stats.events_committed == 0 and second.state == "running"
        first.stop_now()
        await wait_until(
            lambda: not second.ctx.availability.degraded, timeout=60, what="the second streaming"
        )
    finally:
        for r in (first, second):
            r.stop_now()
        await asyncio.gather(*tasks, return_exceptions=True)
        await conn.close()
