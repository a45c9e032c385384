"""PostgreSQL upsert sink against a real private PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from deltaforge.config import parse_pipeline
from deltaforge.events import with_images
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import PoisonEvent, RetryableSinkError
from deltaforge.sinks.postgres import PostgresSink
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import PacedSource, SyntheticSource, make_event, sink_pipeline
from tests.mysql_kit import fresh_db as fresh_mysql_db
from tests.postgres_kit import fresh_db
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.servers.proxy import TcpProxy
from tests.sink_crash import crash_and_recover, outage_and_recover, silenced_and_recover


def pg_doc(dsn: str, **sink: Any) -> dict[str, Any]:
    config = {"id": "p", "dsn": dsn, "key_columns": ["id"], "upsert_strategy": "if_newer", **sink}
    return sink_pipeline("pg", "postgres", config)


async def target(pg: Postgres, ddl: str) -> str:
    db = await fresh_db(pg)
    conn = await asyncpg.connect(pg.dsn(db))
    await conn.execute(ddl)
    await conn.close()
    return db


async def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    out = [tuple(r) for r in await conn.fetch(sql)]
    await conn.close()
    return out


async def test_hundred_thousand_events_converge_to_the_source_state(postgres: Postgres) -> None:
    n = 100_000
    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int, _df_position text)")
    cfg = parse_pipeline(pg_doc(postgres.dsn(db)), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=2000))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=120, what="all committed")
    await runner.drain()
    await task
    got = await rows(postgres.dsn(db), "SELECT id, seq FROM t ORDER BY id")
    expected = sorted({seq % 97: seq for seq in range(1, n + 1)}.items())  # last write per key wins
    assert got == expected


async def test_if_newer_never_lets_a_stale_replay_overwrite(postgres: Postgres) -> None:
    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int, _df_position text)")
    sink = PostgresSink(parse_pipeline(pg_doc(postgres.dsn(db)), env={}).sinks[0])
    await sink.open()
    await sink.deliver([make_event(97 * 3 + 5)])  # id 5, seq 296
    await sink.deliver([make_event(97 * 1 + 5)])  # id 5, seq 102: older, a replay
    assert await rows(postgres.dsn(db), "SELECT id, seq FROM t") == [(5, 296)]
    stale_delete = make_event(97 * 2 + 5)
    stale_delete = type(stale_delete)(
        "d", stale_delete.after, None, stale_delete.source, "0", True, "x", stale_delete.order,
        stale_delete.checkpoint, "acme", 100,
    )  # fmt: skip
    await sink.deliver([stale_delete])  # a delete older than the row: ignored
    assert await rows(postgres.dsn(db), "SELECT id, seq FROM t") == [(5, 296)]
    await sink.close()


async def test_a_target_that_commits_without_flushing_is_made_to_flush_each_batch(postgres: Postgres) -> None:
    """A database (or role, or server) defaulting to synchronous_commit=off answers COMMIT before
    the commit is on disk: a crash of the target then lost batches the sink had checkpointed. The
    sink's session commits with at least a local flush, whatever the default; a stronger setting
    (waiting for a synchronous standby) is left as it is."""
    db = await target(postgres, "CREATE TABLE t (id bigint PRIMARY KEY, seq bigint, _df_position text)")
    admin = await asyncpg.connect(postgres.dsn(db))
    await admin.execute(f"ALTER DATABASE {db} SET synchronous_commit = off")
    await admin.execute("CREATE ROLE careful LOGIN PASSWORD 'pw'; GRANT ALL ON t TO careful")
    await admin.execute(f"ALTER ROLE careful IN DATABASE {db} SET synchronous_commit = remote_apply")
    await admin.close()
    settings = []
    for dsn in (postgres.dsn(db), postgres.dsn(db).replace("postgres@", "careful:pw@", 1)):
        sink = PostgresSink(parse_pipeline(pg_doc(dsn, table="t"), env={}).sinks[0])
        await sink.open()
        assert sink._conn is not None
        settings.append(await sink._conn.fetchval("SHOW synchronous_commit"))
        await sink.deliver([make_event(1)])
        await sink.close()
    assert settings == ["local", "remote_apply"]


async def test_missing_table_is_non_retryable_with_sink_id(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    sink = PostgresSink(parse_pipeline(pg_doc(postgres.dsn(db)), env={}).sinks[0])
    from deltaforge.sinks.base import NonRetryableSinkError

    with pytest.raises(NonRetryableSinkError, match=r"postgres sink 'p': UndefinedTableError"):
        await sink.deliver([make_event(1)])
    await sink.close()


async def test_outage_holds_checkpoint_and_recovers() -> None:
    n = 20_000
    with Postgres() as pg:
        db = await target(pg, "CREATE TABLE t (id int PRIMARY KEY, seq int, _df_position text)")
        store = MemoryCheckpointStore()
        cfg = parse_pipeline(pg_doc(pg.dsn(db)), env={})

        runner = PipelineRunner(cfg, store=store, source=PacedSource(n, chunk=200))
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed > 2000, what="some delivered")
        await asyncio.to_thread(pg._as_postgres, *pg_ctl(pg, "stop"))
        failures = runner.ctx.stats.commit_failures
        await wait_until(lambda: runner.ctx.stats.commit_failures > failures, timeout=60, what="backing off")
        held = await store.get("src::sink::p")
        await asyncio.sleep(0.5)
        assert await store.get("src::sink::p") == held
        await asyncio.to_thread(pg._as_postgres, *pg_ctl(pg, "start"))
        await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=90, what="recovered")
        await runner.drain()
        await task
        got = await rows(pg.dsn(db), "SELECT id, seq FROM t ORDER BY id")
        assert got == sorted({seq % 97: seq for seq in range(1, n + 1)}.items())


def pg_ctl(pg: Postgres, action: str) -> list[str]:
    from tests.servers.postgres import _bin

    args = [_bin("pg_ctl"), "-D", str(pg.data), "-w", action]
    if action == "stop":
        args += ["-m", "fast"]
    else:
        args += ["-l", str(pg.dir / "log")]
    return args


READ_ORDERS = """
import sys, orjson, turso
conn = turso.connect(sys.argv[1])
rows = conn.execute("SELECT id, customer, amount, status, version FROM orders ORDER BY id").fetchall()
sys.stdout.buffer.write(orjson.dumps(rows))
"""

ORDERS = (
    "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount float8, status text, version int, "
    "note bytea, _df_position text)"
)
"""The shared Turso workload's table (``sink_crash``), as the target keeps it."""


def orders_both_sides(tmp_path: Path, dsn: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The workload's orders as the Turso file holds them, and as the target ``dsn`` does."""
    out = subprocess.run(
        [sys.executable, "-c", READ_ORDERS, str(tmp_path / "app.db")], capture_output=True, check=True
    )
    source_rows = [tuple(r) for r in orjson.loads(out.stdout)]
    got = asyncio.run(rows(dsn, "SELECT id, customer, amount, status, version FROM orders ORDER BY id"))
    return source_rows, got


@pytest.mark.slow
def test_sigkill_ends_with_exactly_one_effect_per_change(postgres: Postgres, tmp_path: Path) -> None:
    db = asyncio.run(target(postgres, ORDERS))
    sink = {
        "type": "postgres",
        "config": {"id": "p", "dsn": "${PG}", "key_columns": ["id"], "upsert_strategy": "if_newer"},
    }
    crash_and_recover(tmp_path, sink, {"PG": postgres.dsn(db)}, seed=12)
    source_rows, got = orders_both_sides(tmp_path, postgres.dsn(db))
    assert len(source_rows) > 20
    assert got == source_rows  # the target equals the source: every change applied once, none lost


@pytest.mark.slow
@pytest.mark.outage_minute
def test_target_stopped_for_a_minute_is_waited_for_and_ends_equal_to_the_source(tmp_path: Path) -> None:
    with Postgres() as pg:
        db = asyncio.run(target(pg, ORDERS))
        sink = {
            "type": "postgres",
            "config": {"id": "p", "dsn": "${PG}", "key_columns": ["id"], "upsert_strategy": "if_newer"},
        }
        outage_and_recover(tmp_path, sink, {"PG": pg.dsn(db)}, pg.halt, pg.resume)
        source_rows, got = orders_both_sides(tmp_path, pg.dsn(db))
    assert len(source_rows) > 20
    assert got == source_rows  # the target equals the source after the outage


@pytest.mark.slow
def test_a_target_connection_gone_silent_is_given_up_and_the_target_written_over_a_new_one(
    postgres: Postgres, tmp_path: Path
) -> None:
    """A target whose host vanished (a failover that moved its name), or a connection a NAT
    forgot, answers nothing and closes nothing: a statement sent on it waited for ever, the
    pipeline stuck while the target took new connections. ``query_timeout_s`` gives it up."""
    db = asyncio.run(target(postgres, ORDERS))
    sink = {
        "type": "postgres",
        "config": {"id": "p", "dsn": "${PG}", "key_columns": ["id"], "upsert_strategy": "if_newer",
                   "query_timeout_s": 3},
    }  # fmt: skip
    with TcpProxy(postgres.port) as proxy:
        through = postgres.dsn(db).replace(f":{postgres.port}/", f":{proxy.port}/")
        _, said = silenced_and_recover(tmp_path, sink, {"PG": through}, proxy.freeze)
    assert "no answer for 3 s" in said and "query_timeout_s" in said, said
    source_rows, got = orders_both_sides(tmp_path, postgres.dsn(db))
    assert len(source_rows) > 20
    assert got == source_rows  # every change applied once the silent connection was given up


async def test_a_session_given_up_mid_transaction_is_ended_so_its_locks_hold_nothing_back(
    postgres: Postgres,
) -> None:
    """The connection went silent inside a transaction (a NAT forgot it): the server has not
    noticed, and that session keeps the row locks of its upserts. Each retry on a new connection
    waited on them past ``query_timeout_s`` again, for ever. The next opening ends the session
    it gave up (its pid and start, so never another's)."""
    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int, _df_position text)")
    with TcpProxy(postgres.port) as proxy:
        through = postgres.dsn(db).replace(f":{postgres.port}/", f":{proxy.port}/")
        sink = PostgresSink(parse_pipeline(pg_doc(through, query_timeout_s=2), env={}).sinks[0])
        await sink.open()
        assert sink._conn is not None
        await sink._conn.execute("BEGIN")  # as a batch's transaction: its row lock held when the NAT forgets
        await sink._conn.execute("INSERT INTO t VALUES (5, 0, NULL)")
        proxy.freeze()
        with pytest.raises(RetryableSinkError, match="no answer for 2 s"):
            await sink.deliver([make_event(97 * 3 + 5)])
        await sink.deliver([make_event(97 * 3 + 5)])  # id 5: on a new connection, the old lock gone
        await sink.close()
    assert await rows(postgres.dsn(db), "SELECT id, seq FROM t") == [(5, 296)]


async def test_a_statement_given_up_inside_its_transaction_gives_the_connection_up_at_once(
    postgres: Postgres,
) -> None:
    """The connection went silent while a batch's upsert waited inside its transaction. The
    statement is given up after ``query_timeout_s`` and so is the connection, with no ROLLBACK
    sent on it: asyncpg's cancel of the statement, refused here, ends the connection, and a
    ROLLBACK then failed as ``connection is closed``, taken for an ordinary refusal, so the
    next opening left the silent session, and the row lock its upsert took, in place."""
    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int, _df_position text)")
    holder = await asyncpg.connect(postgres.dsn(db))
    with TcpProxy(postgres.port) as proxy:
        through = postgres.dsn(db).replace(f":{postgres.port}/", f":{proxy.port}/")
        sink = PostgresSink(parse_pipeline(pg_doc(through, query_timeout_s=2), env={}).sinks[0])
        await sink.deliver([make_event(97 * 3 + 6)])  # the target read: the next batch goes to its upsert
        assert sink._backend is not None
        held = holder.transaction()
        await held.start()
        await holder.execute("INSERT INTO t VALUES (5, 0, NULL)")  # id 5's row lock, held
        delivering = asyncio.ensure_future(sink.deliver([make_event(97 * 3 + 5)]))
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
        while not await holder.fetchval(waiting, sink._backend[0]):
            await asyncio.sleep(0.01)
        proxy.freeze()
        proxy.refuse()
        with pytest.raises(RetryableSinkError, match="no answer for 2 s"):
            await delivering
        await held.rollback()  # the silent session's upsert now takes id 5's lock, and keeps it
        proxy.up()
        await sink.deliver([make_event(97 * 3 + 5)])  # on a new connection, the silent session ended
        await sink.close()
    await holder.close()
    assert await rows(postgres.dsn(db), "SELECT id, seq FROM t ORDER BY id") == [(5, 296), (6, 297)]


def into_target(name: str, source: dict[str, Any], target_dsn: str, **sink: Any) -> dict[str, Any]:
    """A pipeline from ``source`` to an if_newer PostgreSQL sink writing ``target_dsn``."""
    config = {"id": "t", "dsn": target_dsn, "upsert_strategy": "if_newer", **sink}
    return {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": name},
            "spec": {"source": source, "sinks": [{"type": "postgres", "config": config}],
                     "batch": {"max_events": 100, "max_ms": 20}}}  # fmt: skip


@contextlib.asynccontextmanager
async def running(doc: dict[str, Any]) -> AsyncIterator[PipelineRunner]:
    """``doc``'s pipeline, running with its source open; drained on the way out."""
    runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: _reader_up(runner), what="reader up")
        yield runner
    finally:
        await runner.drain()
        await task


def _reader_up(runner: PipelineRunner) -> bool:
    """The reader has opened the source (so the slot exists and captures what comes next)."""
    node = runner.snapshot().find("SourceReader")
    return node is not None and node.state == "running"


async def test_postgres_to_postgres_keeps_untouched_toast_values_and_follows_key_changes(
    postgres: Postgres,
) -> None:
    """An update that leaves a TOASTed column alone must not overwrite it with the marker, and an
    update of the primary key must move the row, not leave the old one (default replica identity)."""
    ddl = "CREATE TABLE docs (id int PRIMARY KEY, body text, status text{})"
    source_db = await target(postgres, ddl.format(""))
    target_db = await target(postgres, ddl.format(", _df_position text"))
    body = "".join(random.Random(4).choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(20_000))
    source = {"type": "postgres", "config": {"id": "src", "dsn": postgres.dsn(source_db),
                                             "slot": f"s_{source_db}", "publication": f"p_{source_db}"}}  # fmt: skip
    # no key_columns: the source table's primary key is the default
    async with running(into_target("pg2pg", source, postgres.dsn(target_db))) as runner:
        conn = await asyncpg.connect(postgres.dsn(source_db))
        await conn.execute("INSERT INTO docs VALUES (100, $1, 'new'), (7, 'short', 'new')", body)
        await conn.execute("UPDATE docs SET status = 'paid' WHERE id = 100")  # body unchanged: TOAST marker
        await conn.execute("UPDATE docs SET id = 101 WHERE id = 100")  # the key moves
        await conn.execute("UPDATE docs SET id = 8, status = 'moved' WHERE id = 7")
        await conn.close()
        await wait_until(
            lambda: runner.ctx.stats.events_committed >= 5, timeout=30, what="all changes applied"
        )
    want = await rows(postgres.dsn(source_db), "SELECT id, body, status FROM docs ORDER BY id")
    got = await rows(postgres.dsn(target_db), "SELECT id, body, status FROM docs ORDER BY id")
    assert [r[0] for r in got] == [8, 101]  # no row left behind under its old key
    assert got == want  # the 20,000-character body kept, not replaced by the marker


FAMILY = (
    "CREATE TABLE parent (id int PRIMARY KEY{pos}); "
    "CREATE TABLE child (id int PRIMARY KEY, pid int REFERENCES parent (id){pos})"
)


async def test_tables_truncated_together_in_the_source_are_truncated_together_in_the_target(
    postgres: Postgres,
) -> None:
    """``TRUNCATE parent CASCADE`` (or ``TRUNCATE parent, child``) empties a table and the tables
    referencing it at once; pgoutput sends one message naming both. Truncated one by one, the
    target refused the first (``cannot truncate a table referenced in a foreign key constraint``),
    and the batch was retried for ever: the pipeline stood still behind a statement the source
    had run without error."""
    source_db = await target(postgres, FAMILY.format(pos=""))
    target_db = await target(postgres, FAMILY.format(pos=", _df_position text"))
    source = {"type": "postgres", "config": {"id": "src", "dsn": postgres.dsn(source_db),
                                             "slot": f"s_{source_db}", "publication": f"p_{source_db}"}}  # fmt: skip
    async with running(into_target("family", source, postgres.dsn(target_db))) as runner:
        conn = await asyncpg.connect(postgres.dsn(source_db))
        for truncate in ("TRUNCATE parent CASCADE", "TRUNCATE child, parent"):
            await conn.execute("INSERT INTO parent VALUES (1), (2); INSERT INTO child VALUES (1, 1), (2, 2)")
            await conn.execute(truncate)
        await conn.execute("INSERT INTO parent VALUES (3); INSERT INTO child VALUES (3, 3)")
        await conn.close()
        await wait_until(  # 4 rows and 2 truncates, twice, then 2 rows
            lambda: runner.ctx.stats.events_committed >= 14, timeout=30, what="every change applied"
        )
    for table in ("parent", "child"):
        got = await rows(postgres.dsn(target_db), f"SELECT id FROM {table} ORDER BY id")
        assert got == await rows(postgres.dsn(source_db), f"SELECT id FROM {table} ORDER BY id") == [(3,)]


async def test_a_truncate_the_targets_own_foreign_keys_refuse_stops_the_sink_saying_why(
    postgres: Postgres,
) -> None:
    """A table of the target only references the truncated one: no retry can apply the
    truncate, and waiting for ever would look like an outage."""
    from deltaforge.sinks.base import NonRetryableSinkError

    db = await target(postgres, FAMILY.format(pos=", _df_position text"))
    sink = PostgresSink(parse_pipeline(pg_doc(postgres.dsn(db), table="parent"), env={}).sinks[0])
    truncate = replace(make_event(1), op="t", before=None, after=None)
    with pytest.raises(NonRetryableSinkError, match="cannot truncate a table referenced in a foreign key"):
        await sink.deliver([truncate])
    await sink.close()


async def test_a_target_whose_key_is_deferrable_stops_the_sink_saying_so(postgres: Postgres) -> None:
    """``INSERT … ON CONFLICT`` cannot use a DEFERRABLE key (a target made from a source whose
    key is): every batch was refused and retried for ever, the pipeline degraded as if the
    target were down. No retry can change it: the sink stops, saying what to change."""
    from deltaforge.sinks.base import NonRetryableSinkError

    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY DEFERRABLE, seq int, _df_position text)")
    sink = PostgresSink(parse_pipeline(pg_doc(postgres.dsn(db)), env={}).sinks[0])
    with pytest.raises(NonRetryableSinkError, match=r"DEFERRABLE.*NOT DEFERRABLE"):
        await sink.deliver([make_event(1)])
    await sink.close()


async def minimal_change_applied(
    postgres: Postgres, mariadb: MariaDB, values: str, change: str, events: int
) -> str:
    """MariaDB ``t (id, a, b)`` given ``values`` (full row images), then ``change`` logged by a
    session with ``binlog_row_image`` MINIMAL, through a pipeline into an ``if_newer``
    PostgreSQL ``t``: the target's DSN once ``events`` are applied."""
    db = fresh_mysql_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, a INT, b TEXT)")
    dsn = postgres.dsn(
        await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, a int, b text, _df_position text)")
    )
    source = {"type": "mysql", "config": {"id": "src", "dsn": mariadb.dsn(db), "tables": [f"{db}.t"]}}
    async with running(into_target("my2pg", source, dsn, table="t")) as runner:
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO t VALUES {values}")
            c.commit()
            cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
            cur.execute(change)
            c.commit()
        await wait_until(lambda: runner.ctx.stats.events_committed >= events, timeout=30, what="all applied")
    return dsn


async def test_a_value_a_partial_mysql_row_image_left_out_is_kept_in_the_target(
    postgres: Postgres, mariadb: MariaDB
) -> None:
    """MariaDB → PostgreSQL: an update logged by a session with binlog_row_image=MINIMAL carries
    the changed column only; the target must keep the others, not take a NULL (or the marker)."""
    dsn = await minimal_change_applied(
        postgres, mariadb, "(1, 1, 'one')", "UPDATE t SET a = 10 WHERE id = 1", 2
    )
    assert await rows(dsn, "SELECT id, a, b FROM t") == [(1, 10, "one")]


async def test_a_partial_change_moves_its_row_and_never_makes_one_with_the_values_it_lacks(
    postgres: Postgres, mariadb: MariaDB
) -> None:
    """A change that does not carry every column (a MINIMAL row image; PostgreSQL's unchanged
    TOAST values) can only change a row the target has. A primary-key change of that kind was a
    delete and an insert of what it carried: the row came back under its new key with NULL in
    every other column. And for a key the target lacks, the insert made a row of NULLs where
    the change had no value. Now the row is moved in place, and a change for a missing row makes
    none: never a row the source does not have. (It is not a poison event: a replay after a crash
    meets rows a later change deleted the same way.)"""
    dsn = await minimal_change_applied(
        postgres, mariadb, "(1, 1, 'one'), (3, 3, 'three')", "UPDATE t SET id = 2 WHERE id = 1", 3
    )
    assert await rows(dsn, "SELECT id, a, b FROM t ORDER BY id") == [(2, 1, "one"), (3, 3, "three")]
    sink = PostgresSink(parse_pipeline(pg_doc(dsn, table="t"), env={}).sinks[0])
    missing = {"id": 7, "a": 70, "b": {"__not_logged__": True}}
    await sink.deliver([replace(make_event(99), op="u", before={"id": 7}, after=missing)])
    await sink.close()
    assert await rows(dsn, "SELECT id, a, b FROM t WHERE id = 7") == []


# Column types asyncpg's binary codecs take only as particular Python values (or not from what the
# sources give), with values at their edges, and their neighbours that were fine.
EVERY_TYPE = [
    ("tm", "time", "'12:30:01.5'", "'00:00:00'"), ("ttz", "timetz", "'12:30:01+02'", "'23:59:59-11:30'"),
    ("iv", "interval", "'1 day 02:03:04'", "'-3 years 2 mons -00:00:00.000001'"),
    ("bt", "bit(3)", "B'101'", "B'000'"), ("vb", "varbit", "B'1'", "B''"),
    ("pt", "point", "'(1,2)'", "'(-1.5,1e+300)'"), ("bx", "box", "'((0,0),(1,1))'", "'((2,2),(-1,-1))'"),
    ("rg", "int4range", "'[1,5)'", "'empty'"), ("tr", "tstzrange", "'[2024-01-01,)'", "'(,infinity]'"),
    ("ta", "text[]", "'{a,\"b c\",NULL,\"x\\\\\\\\y\",\"q\\\"\"}'", "'{}'"), ("ia", "int[]", "'{{1,2},{3,4}}'", "'{NULL}'"),
    ("ua", "uuid[]", "'{6ccd780c-baba-1026-9564-5b8c656024db}'", "'{}'"), ("na", "numeric[]", "'{1.5,NaN}'", "'{-0.0}'"),
    ("ba", "bytea[]", "'{\"\\\\\\\\x00ff\",NULL}'", "'{}'"), ("ja", "jsonb[]", "ARRAY['{\"a\": [1, \"b,}\"]}'::jsonb]", "'{}'"),
    ("tsa", "timestamptz[]", "'{\"2024-01-01 00:00:00+05\",infinity}'", "'{}'"),
    ("ts", "timestamp", "'infinity'", "'-infinity'"), ("tz", "timestamptz", "'-infinity'", "'2024-02-29 12:00:00+01'"),
    ("d", "date", "'-infinity'", "'infinity'"), ("ch", "\"char\"", "'x'", "'y'"), ("mn", "money", "'12.34'", "'-0.01'"),
    ("u", "uuid", "'6ccd780c-baba-1026-9564-5b8c656024db'", "'00000000-0000-0000-0000-000000000000'"),
    ("ip", "inet", "'10.0.0.1/8'", "'::1'"), ("jb", "jsonb", "'{\"a\": [1, 2]}'", "'[]'"), ("by", "bytea", "'\\x00ff'", "''"),
    ("nn", "numeric", "'NaN'", "'-1.50'"), ("fl", "float8", "'-Infinity'", "'1e-300'"), ("f4", "real", "'NaN'", "'Infinity'"), ("e", "mood", "'ok'", "'bad'"),
    ("dm", "positive_span", "'2 hours'", "'1 second'"), ("di", "small_int", "5", "-1"),
    ("ea", "mood[]", "'{ok,bad}'", "'{}'"), ("da", "positive_span[]", "'{\"2 hours\",NULL}'", "'{}'"),
    ("ina", "inet[]", "'{10.0.0.1,::1/128}'", "'{}'"), ("tma", "time[]", "'{01:02:03,NULL}'", "'{}'"),
    ("bxa", "box[]", "'{(1,1),(0,0);(2,2),(1,1)}'", "'{}'"),
]  # fmt: skip
TYPES_DDL = """CREATE TYPE mood AS ENUM ('ok', 'bad');
CREATE DOMAIN positive_span AS interval CHECK (VALUE > '0');
CREATE DOMAIN small_int AS int;
CREATE TABLE t (id int UNIQUE, k time PRIMARY KEY, {columns}{extra})"""


async def test_postgres_to_postgres_copies_every_column_type(postgres: Postgres) -> None:
    """A PostgreSQL table with a ``time``, ``interval``, ``bit``, range, geometric or array column,
    or an infinite timestamp, failed every change as a poison event: asyncpg's binary codecs
    want particular Python values, and the source hands on the server's text (and arrays as
    lists, which the sink sent as JSON). The target now reads each such value as text; every
    row, update and delete arrives equal, ``time`` key moves and deletes by it included."""
    columns, names = ", ".join(f"{n} {t}" for n, t, _, _ in EVERY_TYPE), ", ".join(v[0] for v in EVERY_TYPE)
    source_db = await target(postgres, TYPES_DDL.format(columns=columns, extra=""))
    target_db = await target(postgres, TYPES_DDL.format(columns=columns, extra=", _df_position text"))
    values = [(", ".join(v[2] for v in EVERY_TYPE)), (", ".join(v[3] for v in EVERY_TYPE))]
    source = {"type": "postgres", "config": {"id": "src", "dsn": postgres.dsn(source_db),
                                             "slot": f"s_{source_db}", "publication": f"p_{source_db}"}}  # fmt: skip
    async with running(into_target("types", source, postgres.dsn(target_db))) as runner:
        conn = await asyncpg.connect(postgres.dsn(source_db))
        await conn.execute(f"INSERT INTO t VALUES (1, '01:00', {values[0]}), (2, '02:00', {values[1]})")
        await conn.execute("INSERT INTO t (id, k) VALUES (3, '03:00'), (4, '04:00')")  # every column NULL
        await conn.execute(f"UPDATE t SET ({names}) = (SELECT {names} FROM t WHERE id = 1) WHERE id = 3")
        await conn.execute("UPDATE t SET k = '05:00:00.25', iv = '1 minute' WHERE id = 2")  # the key moves
        await conn.execute("DELETE FROM t WHERE id = 4")
        await conn.close()
        await wait_until(lambda: runner.ctx.stats.events_committed >= 7, timeout=30, what="all applied")
        assert runner.failure is None
    # as text, PostgreSQL's own: exact, and NaN equals NaN
    query = f"SELECT id, k, {', '.join(f'{n}::text' for n, _, _, _ in EVERY_TYPE)} FROM t ORDER BY id"
    want, got = await rows(postgres.dsn(source_db), query), await rows(postgres.dsn(target_db), query)
    assert [r[:2] for r in got] == [(1, time(1)), (2, time(5, 0, 0, 250_000)), (3, time(3))]
    assert got == want
    assert got[0][-2:] == want[2][-2:] != (None, None)


async def test_mysql_times_bits_and_documents_reach_postgres_columns_of_their_types(
    postgres: Postgres, mariadb: MariaDB
) -> None:
    """MariaDB → PostgreSQL: a TIME (a timedelta, negative and past a day too) reaches ``time``
    and ``interval`` columns (it was a poison event), a JSON document a ``jsonb`` and a ``text``
    column, a BLOB a ``bytea``; MySQL has no boolean, so a TINYINT(1) or BIT(1) holding 0 or 1
    reaches a ``boolean`` (it was a poison event), a BIT(n) a ``bit(n)`` or ``varbit``."""
    db = fresh_mysql_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            "CREATE TABLE t (id INT PRIMARY KEY, tm TIME(6), iv TIME, doc JSON, txt JSON, b BLOB, "
            "flag TINYINT(1), bit1 BIT(1), b5 BIT(5), b12 BIT(12))"
        )
    target_db = await target(
        postgres,
        "CREATE TABLE t (id int PRIMARY KEY, tm time, iv interval, doc jsonb, txt text, b bytea, flag boolean, "
        "bit1 boolean, b5 bit(5), b12 varbit, _df_position text)",
    )
    source = {"type": "mysql", "config": {"id": "src", "dsn": mariadb.dsn(db), "tables": [f"{db}.t"]}}
    async with running(into_target("my2pg", source, postgres.dsn(target_db), table="t")) as runner:
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute(
                """INSERT INTO t VALUES
                (1, '23:59:59.999999', '-838:59:59', '{"a": [1, "x"]}', '[true]', x'00ff', 1, b'1', b'10110', b'100000000001'),
                (2, '00:00:00', '25:00:01', 'null', '{}', '', 0, b'0', b'00000', b'0')"""
            )
        await wait_until(lambda: runner.ctx.stats.events_committed >= 2, timeout=30, what="both applied")
        assert runner.failure is None
    got = await rows(
        postgres.dsn(target_db),
        "SELECT id, tm, iv::text, doc, txt, b, flag, bit1, b5::text, b12::text FROM t ORDER BY id",
    )
    assert got == [
        (1, time(23, 59, 59, 999_999), "-838:59:59", '{"a": [1, "x"]}', "[true]", b"\x00\xff", True, True, "10110",
         "0000100000000001"),
        (2, time(0), "25:00:01", "null", "{}", b"", False, False, "00000", "0000000000000000"),
    ]  # fmt: skip


async def test_a_target_column_altered_while_running_is_read_again(postgres: Postgres) -> None:
    """The sink reads its target's column types once; the target altered under it refuses a
    batch, and the next attempt reads them again instead of failing the same way forever."""
    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int, tags text, _df_position text)")
    sink = PostgresSink(parse_pipeline(pg_doc(postgres.dsn(db)), env={}).sinks[0])
    await sink.open()
    first = make_event(1)
    assert first.after is not None
    await sink.deliver([replace(first, after={**first.after, "tags": "a"})])
    admin = await asyncpg.connect(postgres.dsn(db))
    await admin.execute("ALTER TABLE t ALTER tags TYPE text[] USING ARRAY[tags]")
    await admin.close()
    change = make_event(98)  # id 1 again, newer
    assert change.after is not None
    change = replace(change, after={**change.after, "tags": ["a", "b c"]})
    # made for the column it knew, the list went as JSON text: refused by asyncpg's text[] codec
    # or, when the statement was prepared before the ALTER, by the server
    with pytest.raises((PoisonEvent, RetryableSinkError), match=r"DataError|DatatypeMismatchError"):
        await sink.deliver([change])
    await sink.deliver([change])
    await sink.close()
    assert await rows(postgres.dsn(db), "SELECT id, seq, tags FROM t") == [(1, 98, ["a", "b c"])]


async def test_identity_and_generated_columns_of_the_target_take_what_the_target_allows(
    postgres: Postgres, mariadb: MariaDB
) -> None:
    """A target made from the source's own DDL (``pg_dump --schema-only``) has its identity
    columns ``GENERATED ALWAYS`` and its generated columns: PostgreSQL refuses an INSERT that
    gives either a value (``GeneratedAlwaysError``), which the sink took for an outage and
    retried for ever, the pipeline degraded and never told why. The source's identity values
    now go in with ``OVERRIDING SYSTEM VALUE`` (a replica keeps its ids), and a generated column
    is left to the target, from PostgreSQL and from MySQL, which logs its virtual columns."""
    ddl = "CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED{})"
    source_db = await target(postgres, ddl.format(""))
    target_db = await target(postgres, ddl.format(", _df_position text"))
    source = {"type": "postgres", "config": {"id": "src", "dsn": postgres.dsn(source_db),
                                             "slot": f"s_{source_db}", "publication": f"p_{source_db}"}}  # fmt: skip
    async with running(into_target("identity", source, postgres.dsn(target_db))) as runner:
        conn = await asyncpg.connect(postgres.dsn(source_db))
        await conn.execute("INSERT INTO t (a) SELECT g FROM generate_series(1, 5) g")
        await conn.execute("UPDATE t SET a = a + 10 WHERE id <= 2")
        await conn.execute("DELETE FROM t WHERE id = 5")
        await conn.close()
        await wait_until(lambda: runner.ctx.stats.events_committed >= 8, timeout=30, what="all applied")
        assert runner.failure is None and not runner.degraded
    query = "SELECT id, a, b FROM t ORDER BY id"
    assert await rows(postgres.dsn(target_db), query) == await rows(postgres.dsn(source_db), query) == [
        (1, 11, 22), (2, 12, 24), (3, 3, 6), (4, 4, 8)
    ]  # fmt: skip

    db = fresh_mysql_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, a INT, v INT AS (a * 3) VIRTUAL)")
    my_target = await target(
        postgres,
        "CREATE TABLE t (id int PRIMARY KEY, a int, v int GENERATED ALWAYS AS (a * 3) STORED, _df_position text)",
    )
    source = {"type": "mysql", "config": {"id": "src", "dsn": mariadb.dsn(db), "tables": [f"{db}.t"]}}
    async with running(into_target("virtual", source, postgres.dsn(my_target), table="t")) as runner:
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("INSERT INTO t (id, a) VALUES (1, 1), (2, 2)")
            cur.execute("UPDATE t SET a = 7 WHERE id = 2")
        await wait_until(lambda: runner.ctx.stats.events_committed >= 3, timeout=30, what="all applied")
        assert runner.failure is None and not runner.degraded
    assert await rows(postgres.dsn(my_target), "SELECT id, a, v FROM t ORDER BY id") == [
        (1, 1, 3),
        (2, 7, 21),
    ]


async def test_a_table_whose_name_holds_a_dot_is_written_as_that_table(postgres: Postgres) -> None:
    """The target's name is split into schema and table at the template's last dot
    (``replica.${source.table}``), never at a dot of the name a placeholder renders: a source
    table named ``order.items`` was written as table ``items`` of a schema ``order`` (or
    ``replica.order``), refused as a relation that does not exist."""
    source_db = await target(postgres, 'CREATE TABLE "order.items" (id int PRIMARY KEY, v int)')
    target_db = await target(
        postgres,
        'CREATE TABLE "order.items" (id int PRIMARY KEY, v int, _df_position text);'
        'CREATE SCHEMA replica; CREATE TABLE replica."order.items" (id int PRIMARY KEY, v int, _df_position text)',
    )
    for n, table in enumerate(("${source.table}", "replica.${source.table}")):
        source = {"type": "postgres", "config": {"id": "src", "dsn": postgres.dsn(source_db),
                                                 "slot": f"s{n}_{source_db}", "publication": f"p{n}_{source_db}"}}  # fmt: skip
        async with running(into_target(f"dot{n}", source, postgres.dsn(target_db), table=table)) as runner:
            conn = await asyncpg.connect(postgres.dsn(source_db))
            await conn.execute(f'INSERT INTO "order.items" VALUES ({n + 1}, {n + 1})')
            await conn.close()
            await wait_until(lambda: runner.ctx.stats.events_committed >= 1 or runner.failure is not None,
                             timeout=30, what="the insert applied")  # fmt: skip
            assert runner.failure is None
    assert await rows(postgres.dsn(target_db), 'SELECT id, v FROM public."order.items"') == [(1, 1)]
    assert await rows(postgres.dsn(target_db), 'SELECT id, v FROM replica."order.items"') == [(2, 2)]


async def test_changes_without_a_key_of_their_own_take_the_target_tables_primary_key(
    postgres: Postgres,
) -> None:
    """A change may come without key columns: a Kafka record whose key is not a JSON object of
    them (a key template upstream, a foreign producer), a source table without a primary key.
    The sink then upserts and deletes by the target table's primary key, which ON CONFLICT needs
    anyway; it stopped the pipeline ("set key_columns") before. With neither, it still stops,
    naming both."""
    from deltaforge.sinks.base import NonRetryableSinkError

    db = await target(postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int, _df_position text); "
                                "CREATE TABLE nokey (id int, seq int, _df_position text)")  # fmt: skip
    sink = PostgresSink(parse_pipeline(pg_doc(postgres.dsn(db), key_columns=None), env={}).sinks[0])
    await sink.open()
    try:
        first, newer = make_event(1), make_event(98)  # the same row (id 1), keyless
        assert first.source.key == ()
        await sink.deliver([first])
        gone = make_event(195)  # id 1 again, later still
        await sink.deliver([newer, with_images(gone, "d", gone.after, None)])
        await sink.deliver([make_event(2)])
        assert await rows(postgres.dsn(db), "SELECT id, seq FROM t") == [(2, 2)]
        orphan = make_event(3)
        orphan = replace(orphan, source=replace(orphan.source, table="nokey"))
        with pytest.raises(
            NonRetryableSinkError, match=r"no key columns for \"nokey\": the event carries none"
        ):
            await sink.deliver([orphan])
    finally:
        await sink.close()
