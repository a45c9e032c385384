"""The PostgreSQL source against a real private PostgreSQL 15 (pgoutput via SQL decoding)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import os
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chaos.harness import ProxyServer, port_of
from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import PositionLost, SourceError, SourceMisconfigured, SourceUnavailable
from deltaforge.sources.postgres.config import PostgresSourceConfig
from deltaforge.sources.postgres.source import PostgresSource
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import damage_on_disk, jsonl, wait_until
from tests.kit import ScriptedSink
from tests.servers.postgres import Postgres

_n = itertools.count(1)


async def fresh_db(pg: Postgres) -> str:
    name = f"app{next(_n)}"
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return name


def source(pg: Postgres, db: str, **extra: Any) -> PostgresSource:
    cfg = {"id": "pg", "dsn": pg.dsn(db), "slot": f"s_{db}", "publication": f"p_{db}", **extra}
    return PostgresSource(PostgresSourceConfig.model_validate(cfg), tenant="acme")


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


TYPES = """CREATE TABLE types (
    id int PRIMARY KEY, big bigint, num numeric(20,6), fl double precision, txt text, raw bytea, ok boolean,
    d date, ts timestamp(6), tstz timestamptz, u uuid, j json, jb jsonb, arr int[], tags text[], nul int
)"""


async def test_mixed_workload_in_commit_order_with_typed_values(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(TYPES)
    await conn.execute("CREATE TABLE other (id int PRIMARY KEY, v int)")
    await conn.execute("ALTER TABLE types REPLICA IDENTITY FULL")
    await conn.execute("ALTER TABLE other REPLICA IDENTITY FULL")
    src = source(postgres, db, tables=["public.types", "public.other"])
    await src.open(None)  # creates publication and slot
    await conn.execute(
        "INSERT INTO types VALUES (1, 9007199254740993, 12345678901234.123456, -2.5e100, 'héllo ✓ 😀', "
        "'\\x00ff10', true, '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.5+02', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, \"two\"]}', '{\"z\": null}', '{1,2,NULL}', "
        "'{\"a b\",c}', NULL)"
    )
    async with conn.transaction():  # multi-table transaction
        await conn.execute("UPDATE types SET txt = 'changed', nul = 7 WHERE id = 1")
        await conn.execute("INSERT INTO other VALUES (1, 1)")
    await conn.execute("DELETE FROM types WHERE id = 1")
    await conn.execute("TRUNCATE other")
    await conn.execute("INSERT INTO other VALUES (2, 2)")
    events = await read_n(src, 6)
    assert [(e.op, e.table) for e in events] == [
        ("c", "types"),
        ("u", "types"),
        ("c", "other"),
        ("d", "types"),
        ("t", "other"),
        ("c", "other"),
    ]
    a = events[0].after
    assert a is not None
    assert (
        a["big"] == 9007199254740993 and a["num"] == Decimal("12345678901234.123456") and a["fl"] == -2.5e100
    )
    assert a["txt"] == "héllo ✓ 😀" and a["raw"] == b"\x00\xff\x10" and a["ok"] is True
    assert a["d"] == dt.date(2024, 2, 29) and a["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert a["tstz"] == dt.datetime(2024, 5, 6, 5, 8, 9, 500000, tzinfo=dt.UTC)
    assert a["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert a["j"] == {"k": [1, "two"]} and a["jb"] == {"z": None}
    assert a["arr"] == [1, 2, None] and a["tags"] == ["a b", "c"] and a["nul"] is None
    upd = events[1]
    assert upd.before is not None and upd.before["txt"] == "héllo ✓ 😀"
    assert upd.after is not None and upd.after["txt"] == "changed" and upd.after["nul"] == 7
    assert [e.tx_end for e in events] == [True, False, True, True, True, True]
    assert events[1].tx_id == events[2].tx_id
    assert events[3].before is not None and events[3].before["id"] == 1 and events[3].after is None
    assert [e.order for e in events] == sorted(e.order for e in events)
    assert events[0].source.schema == "public" and events[0].source.db == db
    await src.close()
    await conn.close()


async def test_one_hundred_thousand_row_transaction_is_one_transaction(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, 100000) g")
    await conn.execute("INSERT INTO big VALUES (0, 'after')")
    events = await read_n(src, 100_001)
    big = events[:100_000]
    assert len({e.tx_id for e in big}) == 1
    assert [e.tx_end for e in big].count(True) == 1 and big[-1].tx_end
    assert [e.after["id"] for e in big if e.after] == list(range(1, 100_001))
    assert events[-1].after == {"id": 0, "v": "after"}
    await src.close()
    await conn.close()


async def test_unchanged_toast_is_marked_not_null(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)")
    await conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO docs VALUES (1, repeat('x', 100000), 1)")
    await conn.execute("UPDATE docs SET n = 2 WHERE id = 1")
    events = await read_n(src, 2)
    assert events[1].after is not None
    assert events[1].after["body"] == {"__unchanged_toast__": True}
    assert events[1].after["n"] == 2
    await src.close()
    await conn.close()


async def test_a_closed_source_has_let_go_of_its_slot(postgres: Postgres, proxies: ProxyServer) -> None:
    """The walsender of a stopped stream exits in its own time; until then the slot is active, and
    a drop (the user's clean-up after stopping a pipeline) or the next reader is refused. close()
    returns once the slot is free: here the proxy passes each connection's close on to the server
    1.5 s late, as a loaded server would notice it late."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    proxy = proxies.proxy("pg", f"127.0.0.1:{postgres.port}")
    proxy.add_toxic(type="slow_close", stream="upstream", attributes={"delay": 1500})
    src = source(postgres, db, dsn=postgres.dsn(db).replace(f":{postgres.port}/", f":{port_of(proxy)}/"))
    await src.open(None)
    await conn.execute("INSERT INTO t VALUES (1)")
    await read_n(src, 1)
    await src.close()
    active = "SELECT active FROM pg_replication_slots WHERE slot_name = $1"
    assert await conn.fetchval(active, f"s_{db}") is False
    await conn.execute("SELECT pg_drop_replication_slot($1)", f"s_{db}")
    await conn.close()


async def test_dropped_slot_is_position_lost(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO t VALUES (1)")
    [ev] = await read_n(src, 1)
    await src.close()
    await conn.execute("SELECT pg_drop_replication_slot($1)", f"s_{db}")
    again = source(postgres, db)
    with pytest.raises(PositionLost, match=rf"^position lost: replication slot 's_{db}' does not exist"):
        await again.open(ev.checkpoint)
    await conn.close()


async def slot_lsn(conn: asyncpg.Connection, slot: str) -> int:
    return int(
        await conn.fetchval("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", slot)
    )


async def test_slot_never_passes_the_durable_checkpoint_and_advances_when_idle(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    await conn.execute("CREATE TABLE unrelated (id int PRIMARY KEY)")
    gate = asyncio.Event()

    async def stall(call: int, events: list[Event]) -> None:
        if call >= 2:
            await gate.wait()  # the second batch hangs until released

    sink = ScriptedSink("a", script=stall)
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "pgslot"},
        "spec": {
            "source": {
                "type": "postgres",
                "config": {
                    "id": "pg",
                    "dsn": postgres.dsn(db),
                    "slot": "s1",
                    "publication": "p1",
                    "tables": ["public.t"],
                    "heartbeat_ms": 100,
                    "poll_interval_ms": 20,
                },
            },
            "sinks": [{"type": "stdout", "config": {"id": "a"}}],
            "batch": {"max_events": 10, "max_ms": 10},
            "storage": {"type": "memory"},
        },
    }
    store = MemoryCheckpointStore()
    runner = PipelineRunner(parse_pipeline(doc, env={}), store=store, sinks={"a": sink})
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: "s1" in runner.ctx.source.slot, what="started")
    await wait_until(lambda: runner.ctx.stats.events_read >= 0 and runner.state == "running", what="running")
    await asyncio.sleep(0.3)
    for i in range(50):
        await conn.execute("INSERT INTO t VALUES ($1)", i)
    await wait_until(lambda: sink.calls >= 2, timeout=20, what="second batch stalled")
    samples = []
    for _ in range(20):  # while the sink is stalled, the slot stays at or behind the durable checkpoint
        durable = await store.get("pg::sink::a")
        lsn = await slot_lsn(conn, "s1")
        assert durable is not None
        assert lsn <= int(durable["lsn"]), "slot advanced past what the sink durably has"
        samples.append(lsn)
        await asyncio.sleep(0.05)
    stalled_at = await store.get("pg::sink::a")
    assert stalled_at is not None and samples[-1] <= int(stalled_at["lsn"])
    gate.set()
    await wait_until(lambda: len(sink.received) == 50, timeout=20, what="all delivered")
    # idle on our table, busy elsewhere: heartbeats still move the slot forward
    before = await slot_lsn(conn, "s1")
    for i in range(20):
        await conn.execute("INSERT INTO unrelated VALUES ($1)", i)
    target = int(await conn.fetchval("SELECT pg_current_wal_lsn()"))
    deadline = asyncio.get_running_loop().time() + 20
    while await slot_lsn(conn, "s1") < target:
        assert asyncio.get_running_loop().time() < deadline, "slot did not advance while idle"
        await asyncio.sleep(0.05)
    assert await slot_lsn(conn, "s1") > before
    assert len(sink.received) == 50  # heartbeats never reach a sink
    await runner.drain()
    await task
    await conn.close()


async def test_slot_of_another_database_is_refused_clearly(postgres: Postgres) -> None:
    first, second = await fresh_db(postgres), await fresh_db(postgres)
    a = source(postgres, first, slot="shared_slot")
    await a.open(None)
    await a.close()
    b = source(postgres, second, slot="shared_slot")
    with pytest.raises(
        SourceMisconfigured, match=rf"'shared_slot' belongs to database '{first}', not '{second}'"
    ):
        await b.open(None)


async def test_dates_and_times_parse_whatever_the_database_datestyle(postgres: Postgres) -> None:
    """A database whose default DateStyle is not ISO (SQL, DMY; another time zone) still gives
    datetimes and dates, not text that merely looks like one."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(f"ALTER DATABASE {db} SET DateStyle = 'SQL, DMY'")
    await conn.execute(f"ALTER DATABASE {db} SET TimeZone = 'America/New_York'")
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, far date)")
    await conn.close()
    src = source(postgres, db)
    await src.open(None)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(
        "INSERT INTO t VALUES (1, '2024-02-29', '2024-01-02 03:04:05.25', '2024-05-06 07:08:09+00', 'infinity')"
    )
    await conn.close()
    [ev] = await read_n(src, 1)
    await src.close()
    assert ev.after == {
        "id": 1,
        "d": dt.date(2024, 2, 29),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 250000),
        "tz": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
        "far": "infinity",  # beyond Python's dates: PostgreSQL's own text, as documented
    }


async def test_a_checkpoint_inside_a_transaction_resumes_with_the_rest_of_it(postgres: Postgres) -> None:
    """respect_source_tx: false may cut a batch (and so a checkpoint) inside a transaction: the
    rows after the cut must come again on resume, not the transaction be skipped whole."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    await conn.close()
    src = source(postgres, db)
    await src.open(None)
    conn = await asyncpg.connect(postgres.dsn(db))
    async with conn.transaction():
        for i in range(1, 11):
            await conn.execute("INSERT INTO t VALUES ($1)", i)
    await conn.close()
    first = await read_n(src, 10)
    await src.close()
    cut = first[3]  # the 4th of 10 rows: a checkpoint inside the transaction
    assert not cut.tx_end
    again = source(postgres, db)
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = await read_n(again, 10)
    await again.close()
    assert [e.after["id"] for e in rest if e.after and e.order > cut.order] == [5, 6, 7, 8, 9, 10]


async def test_events_carry_the_primary_key_under_default_and_full_replica_identity(
    postgres: Postgres,
) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE d (v text, a int, b int, PRIMARY KEY (b, a))")
    await conn.execute("CREATE TABLE f (v text, id int PRIMARY KEY)")
    await conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")  # pgoutput then flags every column
    await conn.close()
    src = source(postgres, db)
    await src.open(None)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("INSERT INTO d VALUES ('x', 1, 2)")
    await conn.execute("INSERT INTO f VALUES ('y', 3)")
    await conn.execute("DELETE FROM f WHERE id = 3")
    await conn.close()
    events = await read_n(src, 3)
    await src.close()
    assert [(e.table, e.source.key) for e in events] == [("d", ("b", "a")), ("f", ("id",)), ("f", ("id",))]


async def test_a_heartbeat_never_passes_a_commit_that_is_written_but_not_flushed(tmp_path: Path) -> None:
    """Item 16. With the WAL writer stopped, an asynchronous commit stays unflushed while other WAL
    pushes the write position past it. Decoding reaches only flushed WAL, so a heartbeat at the write
    position would put every sink's checkpoint past the commit, and its rows would be skipped as
    already held when they arrive. They must arrive."""
    with Postgres() as pg:
        conn = await asyncpg.connect(pg.dsn())
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        await conn.execute("CREATE TABLE filler (payload text)")
        out = tmp_path / "events.jsonl"
        doc = {
            "apiVersion": "deltaforge/v1",
            "kind": "Pipeline",
            "metadata": {"name": "flush"},
            "spec": {
                "source": {"type": "postgres", "config": {"id": "pg", "dsn": pg.dsn(), "slot": "s", "publication": "p",
                                                          "tables": ["public.t"], "heartbeat_ms": 50,
                                                          "poll_interval_ms": 10}},
                "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}],
                "batch": {"max_events": 10, "max_ms": 10},
                "storage": {"type": "memory"},
            },
        }  # fmt: skip
        runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore())
        task = asyncio.create_task(runner.run())

        async def streaming() -> bool:
            return bool(await conn.fetchval("SELECT active FROM pg_replication_slots WHERE slot_name = 's'"))

        while not await streaming():  # the slot exists and the reader streams it
            await asyncio.sleep(0.02)
        await conn.execute("INSERT INTO t VALUES (1)")
        await wait_until(lambda: out.exists() and len(jsonl(out)) == 1, timeout=30, what="first row")
        walwriter = int(
            await conn.fetchval("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
        )
        os.kill(walwriter, signal.SIGSTOP)
        try:
            await conn.execute("SET synchronous_commit = off")
            await conn.execute("INSERT INTO t VALUES (2)")
            committed = int(await conn.fetchval("SELECT pg_current_wal_insert_lsn()"))
            # Twice the WAL buffers (4 MB here), so a backend writes them out, past the commit, with no flush.
            await conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 8000)")
            written = int(await conn.fetchval("SELECT pg_current_wal_lsn()"))
            flushed = int(await conn.fetchval("SELECT pg_current_wal_flush_lsn()"))
            assert flushed < committed <= written, "the scenario needs a written, unflushed commit"
            # The scenario: the flush is held back for 40 heartbeat periods, whatever the reader does.
            await asyncio.sleep(2.0)
        finally:
            os.kill(walwriter, signal.SIGCONT)
        await wait_until(
            lambda: [d["after"]["id"] for d in jsonl(out)] == [1, 2], timeout=30, what="the unflushed row"
        )
        await runner.drain()
        await task
        await conn.close()


async def test_a_resume_from_before_added_and_dropped_columns_decodes_each_row_with_its_columns(
    postgres: Postgres,
) -> None:
    """Issue 15 item 7: rows before and after DDL keep their own columns, also when a restart
    resumes from a checkpoint taken before the DDL."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO t VALUES (1, 1)")
    await conn.execute("ALTER TABLE t ADD COLUMN extra text")
    await conn.execute("INSERT INTO t VALUES (2, 2, 'new')")
    await conn.execute("ALTER TABLE t DROP COLUMN v")
    await conn.execute("INSERT INTO t VALUES (3, 'only')")
    first = await read_n(src, 3)
    await src.close()
    assert [e.after for e in first] == [  # Relation messages drive added and dropped columns
        {"id": 1, "v": 1},
        {"id": 2, "v": 2, "extra": "new"},
        {"id": 3, "extra": "only"},
    ]
    again = source(postgres, db)
    await again.open(again.load_position(first[0].checkpoint.to_doc()))  # before both DDLs
    rest = await read_n(again, 2)
    await again.close()
    await conn.close()
    assert [e.after for e in rest] == [{"id": 2, "v": 2, "extra": "new"}, {"id": 3, "extra": "only"}]


async def test_the_schema_history_gets_a_version_per_column_change_and_none_per_reconnect(
    postgres: Postgres, tmp_path: Path
) -> None:
    """Relation messages are recorded as versions of the table's schema, from the transaction they
    came with; the Relation messages a new session sends again add nothing."""
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "ddl"},
        "spec": {
            "source": {
                "type": "postgres",
                "config": {
                    "id": "pg",
                    "dsn": postgres.dsn(db),
                    "tables": ["public.t"],
                    "slot": f"s_{db}",
                    "publication": f"p_{db}",
                },
            },
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "events.jsonl")}}],
        },
    }
    store = MemoryCheckpointStore()

    async def run_until(n: int) -> None:
        runner = PipelineRunner(parse_pipeline(doc, env={}), store=store)
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=30, what=f"{n} events")
        await runner.drain()
        await task

    slot = source(postgres, db, tables=["public.t"])
    await slot.open(None)  # the slot and publication exist from here on
    await slot.close()
    await conn.execute("INSERT INTO t VALUES (1, 1)")
    await conn.execute("ALTER TABLE t ADD COLUMN extra text")
    await conn.execute("INSERT INTO t VALUES (2, 2, 'new')")
    await run_until(2)
    await conn.execute("ALTER TABLE t DROP COLUMN v")
    await conn.execute("INSERT INTO t VALUES (3, 'only')")
    await run_until(1)  # a new session: Relation messages for t again, one of them new
    await conn.execute("INSERT INTO t VALUES (4, 'more')")
    await run_until(1)
    await conn.close()
    history = await store.schema_history("pg", "public.t")
    assert [[c["name"] for c in h["columns"]] for h in history] == [
        ["id", "v"],
        ["id", "v", "extra"],
        ["id", "extra"],
    ]
    commits = [h["position"]["commit_lsn"] for h in history]
    assert commits == sorted(commits) and len(set(commits)) == 3
    assert [e["after"]["id"] for e in jsonl(tmp_path / "events.jsonl")] == [1, 2, 3, 4]


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
