"""A sink added to a pipeline whose sinks hold checkpoints: the sinks already there go on from
their own checkpoints (the changes made while the pipeline was down among them), and the new one
gets the tables' rows (copied by a snapshot, or every change still on the server) and every change
after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import turso
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from tests.helpers import wait_until
from tests.kit import ScriptedSink
from tests.mysql_kit import fresh_db
from tests.postgres_kit import fresh_db as pg_fresh_db
from tests.servers.mariadb import CDC_USER, MariaDB
from tests.servers.postgres import Postgres

Received = dict[str, list[tuple[str, int]]]
"""Per sink, the (op, id) of each change of ``items`` it was given, in order."""


def collecting(sid: str, got: Received) -> ScriptedSink:
    """Sink ``sid``: the changes of ``items`` into ``got[sid]``, another table's into
    ``got["sid:table"]``."""
    got.setdefault(sid, [])

    def keep(_n: int, events: list[Event]) -> None:
        for e in events:
            row = e.after or e.before
            if row is not None and e.op != "h":
                got.setdefault(sid if e.table == "items" else f"{sid}:{e.table}", []).append(
                    (e.op, int(row["id"]))
                )

    return ScriptedSink(sid, script=keep)


def replayed(events: list[tuple[str, int]]) -> set[int]:
    state: set[int] = set()
    for op, key in events:
        (state.discard if op == "d" else state.add)(key)
    return state


def reader_running(runner: PipelineRunner) -> bool:
    reader = runner.snapshot().find("SourceReader")
    return reader is not None and reader.state == "running"  # the source open (a slot made)


async def run_until(
    source: dict[str, Any],
    sinks: list[str],
    store: MemoryCheckpointStore,
    got: Received,
    done: Callable[[PipelineRunner], bool],
    then: Callable[[], None] | None = None,
    optional: tuple[str, ...] = (),
) -> PipelineRunner:
    """A pipeline from ``source`` into ``sinks`` (``optional`` ones not required) until ``done()``,
    a checkpoint written after it (``then()`` runs once the pipeline has started delivering);
    drained and stopped."""
    doc = {
        "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "added"},
        "spec": {"source": source,
                 "sinks": [{"type": "stdout", "config": {"id": s, "required": s not in optional}} for s in sinks],
                 "batch": {"max_events": 100, "max_ms": 20},
                 "supervision": {"max_restarts": 50, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 20}}},
    }  # fmt: skip
    runner = PipelineRunner(
        parse_pipeline(doc, env={}), store=store, sinks={s: collecting(s, got) for s in sinks}
    )
    task = asyncio.create_task(runner.run())
    try:
        if then is not None:
            await wait_until(lambda: reader_running(runner), timeout=60, what="the source open")
            then()
        await wait_until(lambda: done(runner), timeout=60, what="the sinks' events")
        await runner.drain()
    finally:
        runner.stop_now()
        await asyncio.gather(task, return_exceptions=True)
    return runner


class Tables:
    """A database with a table ``items(id)`` and rows 1 and 2, its source's document, and a way
    to write to it."""

    def __init__(
        self, source: dict[str, Any], write: Callable[[str], None], qualified: Callable[[str], str]
    ) -> None:
        self.source, self.write, self.qualified = source, write, qualified


async def mariadb_items(server: MariaDB) -> Tables:
    db = fresh_db(server)

    def write(sql: str) -> None:
        with server.root(db) as c, c.cursor() as cur:
            cur.execute(sql)

    write(f"GRANT CREATE, INSERT, UPDATE ON {db}.* TO '{CDC_USER}'@'%'")  # the signal table
    write("CREATE TABLE items (id bigint PRIMARY KEY)")
    return Tables(
        {"type": "mysql", "config": {"id": "my", "dsn": server.dsn(db), "tables": [f"{db}.items"]}},
        write,
        lambda table: f"{db}.{table}",
    )


async def postgres_items(server: Postgres) -> Tables:
    db = await pg_fresh_db(server)

    def write(sql: str) -> None:
        with psycopg.connect(server.dsn(db), autocommit=True) as conn:
            conn.execute(sql.encode())

    write("CREATE TABLE items (id bigint PRIMARY KEY)")
    config = {
        "id": "pg",
        "dsn": server.dsn(db),
        "slot": f"s_{db}",
        "publication": f"p_{db}",
        "tables": ["public.items"],
    }
    return Tables({"type": "postgres", "config": config}, write, lambda table: f"public.{table}")


async def turso_items(path: Path) -> Tables:
    def write(sql: str) -> None:
        conn = turso.connect(str(path))
        try:
            conn.execute("PRAGMA unstable_capture_data_changes_conn('full')")
            conn.execute(sql)
            conn.commit()
        finally:
            conn.close()

    write("CREATE TABLE items (id INTEGER PRIMARY KEY)")
    return Tables(
        {"type": "turso", "config": {"id": "t", "path": str(path), "tables": ["items"]}}, write, str
    )


@pytest.fixture
async def items(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Tables]:
    kind = request.param
    if kind == "mariadb":
        yield await mariadb_items(request.getfixturevalue("mariadb"))
    elif kind == "postgres":
        pg = request.getfixturevalue("postgres")
        tables = await postgres_items(pg)
        yield tables
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:  # the server has a few slots only
            conn.execute("SELECT pg_drop_replication_slot(%s)", (tables.source["config"]["slot"],))
    else:
        yield await turso_items(tmp_path / "app.db")


@pytest.mark.parametrize("items", ["mariadb", "postgres", "turso"], indirect=True)
@pytest.mark.parametrize("mode", ["never", "initial", "when_needed", "always"])
async def test_a_sink_added_takes_nothing_from_the_sinks_already_there(items: Tables, mode: str) -> None:
    """Rows 1-2 reach sink a (snapshotted, or streamed with ``never``), row 3 is streamed. While
    the pipeline is down row 1 is deleted and row 4 inserted, and sink b is added: a gets the
    delete and the insert (its replay equals the table; it kept row 1 before), b the table's rows
    by a snapshot and the changes from a's checkpoint on (with ``never``, every change the source
    still has, as for a sink that never delivered)."""
    source = {**items.source, "config": {**items.source["config"], "snapshot": {"mode": mode}}}
    store, got = MemoryCheckpointStore(), Received()
    if mode == "never":  # streamed: the pipeline is reading before they are written
        then = lambda: [items.write(f"INSERT INTO items VALUES ({i})") for i in (1, 2, 3)]  # noqa: E731
    else:
        items.write("INSERT INTO items VALUES (1), (2)")
        then = lambda: [items.write("INSERT INTO items VALUES (3)")]  # noqa: E731
    await run_until(source, ["a"], store, got, lambda _: replayed(got["a"]) == {1, 2, 3}, then=then)
    # Started again once: a finished snapshot's progress (which held where its stream began) is gone.
    await run_until(source, ["a"], store, got, reader_running)
    items.write("DELETE FROM items WHERE id = 1")
    items.write("INSERT INTO items VALUES (4)")
    await run_until(
        source, ["a", "b"], store, got, lambda _: 4 in replayed(got["a"]) and 4 in replayed(got["b"])
    )
    assert replayed(got["a"]) == {2, 3, 4}, got["a"]
    if mode != "never":
        assert replayed(got["b"]) == {2, 3, 4}, got["b"]
    elif items.source["type"] == "postgres":  # the slot keeps nothing a checkpoint let go
        assert got["b"] == [("d", 1), ("c", 4)], got["b"]
    else:  # every change the binlog and the CDC table still have
        assert got["b"] == [("c", 1), ("c", 2), ("c", 3), ("d", 1), ("c", 4)], got["b"]


@pytest.mark.parametrize("b_required", [True, False])
async def test_a_sink_added_back_after_its_binlog_was_purged_is_named(
    mariadb: MariaDB, b_required: bool
) -> None:
    """Sink b taken out of the pipeline for a while and put back, the binlog holding a row it
    never got purged meanwhile. A required b halts the pipeline as position lost, as before, and
    ``position_lost_at_sinks`` names b (the source's message names only the binlog file); an
    optional b is its own loss: it is given a snapshot (``initial``) and a goes on."""
    items = await mariadb_items(mariadb)
    source = {**items.source, "config": {**items.source["config"], "snapshot": {"mode": "initial"}}}
    store, got = MemoryCheckpointStore(), Received()
    items.write("INSERT INTO items VALUES (1)")
    optional = () if b_required else ("b",)
    both = lambda _: 1 in replayed(got["a"]) and 1 in replayed(got["b"])  # noqa: E731
    await run_until(source, ["a", "b"], store, got, both, optional=optional)
    items.write("INSERT INTO items VALUES (2)")  # after b's checkpoint, in the same file
    await run_until(source, ["a"], store, got, lambda _: 2 in replayed(got["a"]))
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        older = cur.fetchone()[0]  # b's checkpoint and the row it never got are in it
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        newer = cur.fetchone()[0]

    def purged() -> bool:  # the stopped reading's dump thread may hold the file a moment longer
        with mariadb.root() as c, c.cursor() as cur:
            cur.execute(f"PURGE BINARY LOGS TO '{newer}'")
            cur.execute("SHOW BINARY LOGS")
            return older not in {r[0] for r in cur.fetchall()}

    await wait_until(purged, timeout=15, what=f"{older} purged")
    items.write("INSERT INTO items VALUES (3)")
    got["b"] = []
    with capture_logs() as logs:
        runner = await run_until(
            source, ["a", "b"], store, got,
            lambda r: r.failure is not None if b_required else {1, 2, 3} <= replayed(got["b"]),
            optional=optional,
        )  # fmt: skip
    said = [
        (e["event"], e["sinks"])
        for e in logs
        if e["event"] in ("position_lost_at_sinks", "sink_position_lost")
    ]
    if b_required:
        assert str(runner.failure).startswith("position lost: binlog file ")
        assert said == [("position_lost_at_sinks", ["b"])]
        [named] = [e for e in logs if e["event"] == "position_lost_at_sinks"]
        key = sink_key(items.source["config"]["id"], "b")
        assert f"deltaforge checkpoints --forget {key}" in named["reason"]
        await store.delete_keys([key])  # what that command does
        runner = await run_until(source, ["a", "b"], store, got, lambda _: {1, 2, 3} <= replayed(got["b"]))
        assert runner.failure is None and 3 in replayed(got["a"])  # b given a snapshot, a went on
    else:
        assert runner.failure is None and 3 in replayed(got["a"])
        assert said == [("sink_position_lost", ["b"])]


@pytest.mark.parametrize("items", ["postgres"], indirect=True)
async def test_an_optional_sink_put_back_after_the_slot_moved_on_is_given_a_snapshot(items: Tables) -> None:
    """PostgreSQL's side of the test above: optional sink b taken out, the slot moved on for a
    alone (past b's checkpoint: position lost for b), b put back. It is given a snapshot and
    a goes on; before, the slot past the checkpoint halted the whole pipeline."""
    config = items.source["config"]
    source = {**items.source, "config": {**config, "snapshot": {"mode": "initial"}, "heartbeat_ms": 100}}
    store, got = MemoryCheckpointStore(), Received()
    items.write("INSERT INTO items VALUES (1)")
    both = lambda _: 1 in replayed(got["a"]) and 1 in replayed(got["b"])  # noqa: E731
    await run_until(source, ["a", "b"], store, got, both, optional=("b",))
    [b_at] = (await store.get_many([k for k in await store.list_all() if k.endswith("::b")])).values()

    def slot_past_b() -> bool:
        with psycopg.connect(config["dsn"], autocommit=True) as conn:
            confirmed = (
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = %s"
            )
            row = conn.execute(confirmed.encode(), (config["slot"],)).fetchone()
        return row is not None and int(row[0]) > int(b_at["lsn"])

    items.write("INSERT INTO items VALUES (2)")
    await run_until(source, ["a"], store, got, lambda _: 2 in replayed(got["a"]) and slot_past_b())
    items.write("INSERT INTO items VALUES (3)")
    got["b"] = []
    with capture_logs() as logs:
        runner = await run_until(
            source, ["a", "b"], store, got, lambda _: {1, 2, 3} <= replayed(got["b"]), optional=("b",)
        )
    said = [
        (e["event"], e["sinks"])
        for e in logs
        if e["event"] in ("position_lost_at_sinks", "sink_position_lost")
    ]
    assert runner.failure is None and said == [("sink_position_lost", ["b"])]
    assert replayed(got["a"]) == replayed(got["b"]) == {1, 2, 3}
