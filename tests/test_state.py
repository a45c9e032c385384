"""Checkpoint stores: versions, rollback, atomic multi-key writes, SIGKILL survival."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.owner import owner_key
from deltaforge.pipeline.reconciler import identity_key
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.snapshot.listed import listed_key
from deltaforge.snapshot.progress import progress_key
from deltaforge.state.checkpoints import CheckpointStore, FileCheckpointStore, MemoryCheckpointStore, sink_key
from deltaforge.state.sqlite_store import SqliteCheckpointStore
from tests.helpers import file_size_limit
from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc


def stores(tmp_path: Path) -> list[CheckpointStore]:
    return [
        MemoryCheckpointStore(),
        FileCheckpointStore(tmp_path / "cp.json"),
        SqliteCheckpointStore(tmp_path / "cp.db"),
    ]


@pytest.mark.parametrize("kind", [0, 1, 2], ids=["memory", "file", "sqlite"])
async def test_versions_and_rollback(tmp_path: Path, kind: int) -> None:
    store = stores(tmp_path)[kind]
    await store.open()
    key = sink_key("src", "k1")
    assert key == "src::sink::k1"
    for i in range(1, 6):
        await store.put_many({key: {"change_id": i * 10}, sink_key("src", "k2"): {"change_id": i}})
    assert await store.get(key) == {"change_id": 50}
    versions = await store.versions(key)
    assert [v.version for v in versions] == [1, 2, 3, 4, 5]
    assert versions[1].value == {"change_id": 20}
    await store.rollback(key, 2)
    assert await store.get(key) == {"change_id": 20}
    assert (await store.list_all())[key][0] == 6  # rollback is a new version, history kept
    with pytest.raises(KeyError, match="no version 99"):
        await store.rollback(key, 99)
    await store.close()


@pytest.mark.parametrize("kind", [1, 2], ids=["file", "sqlite"])
async def test_reopened_store_keeps_values(tmp_path: Path, kind: int) -> None:
    store = stores(tmp_path)[kind]
    await store.open()
    await store.put("a", {"x": 1})
    await store.close()
    again = stores(tmp_path)[kind]
    await again.open()
    assert await again.get("a") == {"x": 1}
    assert len(await again.versions("a")) == 1
    await again.close()


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from deltaforge.state.sqlite_store import SqliteCheckpointStore

    async def main():
        store = SqliteCheckpointStore(sys.argv[1])
        await store.open()
        i = 0
        while True:
            i += 1
            await store.put_many({"s::sink::a": {"n": i}, "s::sink::b": {"n": i}})
            print(i, flush=True)

    asyncio.run(main())
    """
)


def test_sqlite_checkpoints_survive_sigkill(tmp_path: Path) -> None:
    import asyncio

    db = tmp_path / "cp.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    last = 0
    for line in proc.stdout:
        last = int(line)
        if last >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    async def check() -> tuple[dict[str, object] | None, dict[str, object] | None]:
        store = SqliteCheckpointStore(db)
        await store.open()
        try:
            return await store.get("s::sink::a"), await store.get("s::sink::b")
        finally:
            await store.close()

    a, b = asyncio.run(check())
    assert a is not None and b is not None
    assert a == b  # both keys of one write, or neither
    assert int(a["n"]) >= last  # type: ignore[call-overload]  # every acknowledged write is there


# Checkpoint values exactly as deltaforge stored them before positions were typed (0.1.0:
# plain dicts built in sources/mysql.py, postgres.py and turso.py), and what they mean.
PREVIOUS_FORMAT = [
    ("mysql", {"file": "mysql-bin.000003", "pos": 1234, "row": 0, "gtid": "0-1-42"}),
    ("mysql", {"file": "mysql-bin.000001", "pos": 4, "row": 0, "gtid": ""}),
    ("postgres", {"lsn": 23456, "commit_lsn": 23400, "seq": 2**31}),
    ("postgres", {"lsn": 23000, "commit_lsn": 23400, "seq": 3}),
    ("turso", {"change_id": 17}),
]


@pytest.mark.parametrize(("source", "stored"), PREVIOUS_FORMAT)
async def test_checkpoints_in_the_previous_format_load_as_typed_positions(
    tmp_path: Path, source: str, stored: dict[str, object]
) -> None:
    from deltaforge.sources.mysql.position import BinlogPosition
    from deltaforge.sources.mysql.source import MySQLSource
    from deltaforge.sources.postgres.position import PgPosition
    from deltaforge.sources.postgres.source import PostgresSource
    from deltaforge.sources.turso.position import TursoPosition
    from deltaforge.sources.turso.source import TursoSource

    store = SqliteCheckpointStore(tmp_path / "cp.db")
    await store.open()
    await store.put("src::sink::a", stored)  # type: ignore[arg-type]
    await store.close()
    store = SqliteCheckpointStore(tmp_path / "cp.db")
    await store.open()
    doc = await store.get("src::sink::a")
    await store.close()
    assert doc is not None
    reader = {"mysql": MySQLSource, "postgres": PostgresSource, "turso": TursoSource}[source]
    position = reader.load_position(doc)
    kind = {"mysql": BinlogPosition, "postgres": PgPosition, "turso": TursoPosition}[source]
    assert isinstance(position, kind)
    assert position.to_doc() == stored  # written back unchanged: older versions can still read it
    expected_order = {
        "mysql": lambda d: (0, int(str(d["file"]).rsplit(".", 1)[1]), d["pos"], d["row"]),
        "postgres": lambda d: (d["commit_lsn"], d["seq"]),
        "turso": lambda d: (d["change_id"], 0),  # then snapshot rows at it, then after_snapshot 1
    }[source](stored)
    assert position.order == expected_order


def test_a_postgres_position_keeps_its_commit_time_through_its_document() -> None:
    """The commit time (and a heartbeat's last transaction, and whether it is quiet) survive the
    checkpoint store: the restored-server check at the next opening needs them
    (``tests/test_postgres_lost_wal.py``)."""
    from deltaforge.sources.postgres.position import END, PgPosition

    event = PgPosition(23456, 23400, END, 849_511_875_727_915)
    beat = PgPosition(24000, 23999, END, 849_511_875_727_915, 23400)
    quiet = PgPosition(24000, 23999, END, 849_511_875_727_915, 23400, quiet=1)
    for position in (event, beat, quiet):
        assert PgPosition.from_doc(position.to_doc()) == position
        assert position.last_commit == (23400, 849_511_875_727_915)
    assert "quiet" not in beat.to_doc()  # older versions read it unchanged
    assert PgPosition(23456, 23400).last_commit is None  # written before times were kept: not checked


def test_positions_order_across_binlog_files_numerically() -> None:
    from deltaforge.sources.mysql.position import BinlogPosition

    early, late = BinlogPosition("mysql-bin.999999", 9_000, 5), BinlogPosition("mysql-bin.1000000", 4)
    assert early.order < late.order  # not text order
    assert BinlogPosition.from_doc({"file": "mysql-bin.000002", "pos": 7}) == BinlogPosition(
        "mysql-bin.000002", 7, 0, ""
    )


def test_a_failover_generation_orders_after_any_binlog_coordinate_of_the_one_before() -> None:
    """The new server's binlog may be at file 1 while the old one was at 9: the generation leads."""
    from deltaforge.sources.mysql.position import BinlogPosition

    old, new = BinlogPosition("mysql-bin.000009", 90_000, 3), BinlogPosition("b-bin.000001", 4, gen=1)
    assert old.order < new.order
    assert BinlogPosition.from_doc(new.to_doc()) == new
    assert "gen" not in old.to_doc()  # positions from before generations read back unchanged


async def test_sqlite_store_writes_are_durable_before_they_count(tmp_path: Path) -> None:
    """What a source releases irreversibly (a slot advanced) is only what the store holds with
    synchronous=FULL: WAL with NORMAL survives SIGKILL but may lose the last commits on power loss."""
    store = SqliteCheckpointStore(tmp_path / "cp.db")
    await store.open()
    try:
        async with store.db.execute("PRAGMA synchronous") as cur:
            (level,) = await cur.fetchone()  # type: ignore[misc]
        async with store.db.execute("PRAGMA journal_mode") as cur:
            (mode,) = await cur.fetchone()  # type: ignore[misc]
    finally:
        await store.close()
    assert (level, mode) == (2, "wal")  # 2 = FULL


async def test_pipelines_opening_one_new_sqlite_store_together_all_open(tmp_path: Path) -> None:
    """Pipelines of one ``serve`` sharing a store start at once; SQLite refuses the switch to WAL
    with "database is locked" (no busy handler) when another connection opens the file meanwhile —
    about one round in six before the retry."""
    for round_ in range(40):
        path = tmp_path / f"cp{round_}.db"
        opened = [SqliteCheckpointStore(path) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in opened))
        await opened[0].put_many({"k": {"order": [round_]}})
        assert [await s.get_many(["k"]) for s in opened] == [{"k": {"order": [round_]}}] * 4
        for s in opened:
            await s.close()


async def test_a_store_that_cannot_open_fails_the_pipeline_saying_where(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "p"},
        "spec": {
            "source": {"type": "turso", "config": {"id": "src", "path": str(tmp_path / "app.db")}},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "out.jsonl")}}],
            "storage": {"type": "sqlite", "path": str(tmp_path / "not-a-dir" / "cp.db")},
        },
    }
    runner = PipelineRunner(parse_pipeline(doc, env={}))
    await asyncio.wait_for(runner.run(), 30)
    assert runner.state == "failed"
    assert runner.failure is not None and runner.failure.startswith(
        "spec.storage: cannot open the sqlite store at "
    )
    assert str(tmp_path / "not-a-dir" / "cp.db") in runner.failure


async def test_forgetting_a_pipelines_checkpoints_forgets_its_source_records_too() -> None:
    """Deleting a pipeline with its checkpoints leaves nothing a pipeline created again under
    its name would start from: not the sinks' checkpoints, not the failover identity, not a
    snapshot's progress (with the stream position it began at, which could have been purged),
    not the tables listed at its last start; and its source id is free for another pipeline."""
    store = MemoryCheckpointStore()
    runner = PipelineRunner(
        config(sinks=[sink_doc("a")]), store=store, sinks={"a": ScriptedSink("a")}, source=SyntheticSource(1)
    )
    keys = [
        runner.ctx.key("a"),
        identity_key("src"),
        progress_key("src"),
        owner_key("src"),
        listed_key("src"),
    ]
    other = progress_key("another")
    for key in [*keys, other]:
        await store.put(key, {"seq": 1})
    await runner.forget_checkpoints()
    assert [await store.get(k) for k in keys] == [None] * len(keys)
    assert await store.get(other) == {"seq": 1}


async def test_writers_sharing_the_sqlite_store_never_share_a_transaction(tmp_path: Path) -> None:
    """A batch's checkpoints are written all or none, while other writers (the DLQ, schema
    history) write to the same connection. Interleaved, a dead letter's COMMIT used to make the
    first half of a failing checkpoint write durable, and the checkpoint write's ROLLBACK undid
    dead letters already counted as kept (lost for good on a full disk)."""
    store = SqliteCheckpointStore(tmp_path / "state.db")
    await store.open()
    keys = [f"src::sink::s{i}" for i in range(40)]
    failing: dict[str, Any] = {k: {"seq": 1} for k in keys}
    failing[keys[-1]] = {"seq": {1, 2}}  # cannot be encoded: the write fails at its last key
    entry = {"pipeline": "p", "sink": "s0", "kind": "rejected", "at": 1.0, "position": {"seq": 7}}

    async def checkpoints() -> None:
        with pytest.raises(TypeError):
            await store.put_many(failing)

    async def dead_letters() -> None:
        for _ in range(20):
            await store.dead_letters.add(entry)
            await store.record_schema("src", "db.t", [{"name": "id", "type": "int"}], {"seq": 7})

    async with anyio.create_task_group() as tg:
        tg.start_soon(checkpoints)
        tg.start_soon(dead_letters)
    assert await store.get_many(keys) == {}  # none of the failed write
    assert len(await store.dead_letters.select("p")) == 20  # every entry counted as kept
    assert len(await store.schema_history("src", "db.t")) == 20
    await store.close()
    reopened = SqliteCheckpointStore(tmp_path / "state.db")  # and so on disk
    await reopened.open()
    assert await reopened.get_many(keys) == {} and len(await reopened.dead_letters.select("p")) == 20
    await reopened.close()


async def test_writers_side_by_side_on_the_file_store_all_reach_the_file(tmp_path: Path) -> None:
    """Each write rewrites the whole file. Side by side, two rewrites could land in the other
    order, the older state replacing the newer: a checkpoint or dead letter reported durable was
    not in the file (about 5 writes of 60 lost on the code before)."""
    store = FileCheckpointStore(tmp_path / "cp.json")
    await store.open()
    keys = [f"src::sink::s{i}" for i in range(30)]
    entry = {"pipeline": "p", "sink": "s0", "kind": "rejected", "at": 1.0}
    async with anyio.create_task_group() as tg:
        for i, key in enumerate(keys):
            tg.start_soon(store.put, key, {"seq": i})
            tg.start_soon(store.dead_letters.add, entry)
    reopened = FileCheckpointStore(tmp_path / "cp.json")
    await reopened.open()
    assert await reopened.get_many(keys) == {k: {"seq": i} for i, k in enumerate(keys)}
    assert sorted(e["seq"] for e in await reopened.dead_letters.select("p")) == list(range(1, 31))


async def test_what_the_file_store_could_not_write_is_kept_once_by_the_retry(tmp_path: Path) -> None:
    """A dead letter or schema version the file store could not write (a full disk) is not kept
    in memory either: the retry keeps it once (it used to keep it twice)."""
    store = FileCheckpointStore(tmp_path / "cp.json")
    await store.open()
    entry = {"pipeline": "p", "sink": "s0", "kind": "rejected", "at": 1.0}
    columns = [{"name": "id", "type": "int"}]
    with file_size_limit(0):
        with pytest.raises(OSError):
            await store.dead_letters.add(entry)
        with pytest.raises(OSError):
            await store.record_schema("src", "db.t", columns, {"seq": 1})
    await store.dead_letters.add(entry)
    await store.record_schema("src", "db.t", columns, {"seq": 1})
    reopened = FileCheckpointStore(tmp_path / "cp.json")
    await reopened.open()
    for s in (store, reopened):
        assert len(await s.dead_letters.select("p")) == 1
        assert len(await s.schema_history("src", "db.t")) == 1
