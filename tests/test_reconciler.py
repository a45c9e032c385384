"""The FailoverReconciler's bookkeeping, in-process: outcomes, records, and a rerun after a crash."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from deltaforge.events import Event
from deltaforge.pipeline import reconciler as reconciler_module
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.reconciler import FailoverReconciler, identity_key
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.position import Position
from deltaforge.sources.base import DeclaredTable, PositionLost, SourceMisconfigured, Undeterminable
from deltaforge.state.checkpoints import MemoryCheckpointStore
from deltaforge.state.sqlite_store import SqliteCheckpointStore
from supervision import Unavailable
from tests.helpers import file_size_limit, restarts, wait_until
from tests.kit import ScriptedSink, SeqPosition, SyntheticSource, config, sink_doc


class ServerSource(SyntheticSource):
    """A synthetic source behind a server whose identity and reachability the test sets."""

    def __init__(self, total: int = 10) -> None:
        super().__init__(total)
        self.server: dict[str, str] = {"server_id": "1"}
        self.verdict: Exception | None = None
        self.asked: list[dict[str, str] | None] = []
        self.tables: list[DeclaredTable] = []

    async def describe_tables(self) -> list[DeclaredTable]:
        return list(self.tables)

    async def identity(self) -> dict[str, str] | None:
        return dict(self.server)

    async def reconcile(self, checkpoint: Position, previous: dict[str, str] | None) -> None:
        self.asked.append(previous)
        if self.verdict is not None:
            raise self.verdict


async def reconciler(store: MemoryCheckpointStore, source: ServerSource) -> FailoverReconciler:
    ctx = PipelineContext(config(sinks=[sink_doc("a")]), store, source, {})
    actor = FailoverReconciler(ctx)
    await actor.on_start()
    return actor


async def test_first_seen_then_same_then_changed_with_one_record_even_when_rerun() -> None:
    store, source = MemoryCheckpointStore(), ServerSource()
    cp = SeqPosition(5)
    first = await reconciler(store, source)
    assert await first._reconcile(None) == "first_seen"
    assert await first._reconcile(cp) == "same" and source.asked == [None]
    source.server = {"server_id": "2"}
    assert await first._reconcile(cp) == "changed"
    assert source.asked[-1] == {"server_id": "1"}  # the checkpoint's server, for the checks
    [record] = first.ctx.reconcile_records
    assert record["kind"] == "failover" and record["result"] == "reachable"
    # Killed between the record and the identity write: the next start redoes the same work
    # and rewrites the same record.
    await store.put(identity_key("src"), {"fields": {"server_id": "1"}})
    again = await reconciler(store, source)
    assert await again._reconcile(cp) == "changed"
    assert len(again.ctx.reconcile_records) == 1
    assert (await store.get(identity_key("src")) or {})["fields"] == {"server_id": "2"}
    assert source.generation == 1  # a failover starts a new generation, stored with the identity
    later = ServerSource()
    later.server = {"server_id": "2"}
    assert await (await reconciler(store, later))._reconcile(cp) == "same"
    assert later.generation == 1


async def test_schema_drift_is_recorded_once_and_halts_under_halt_or_adapts() -> None:
    store, source = MemoryCheckpointStore(), ServerSource()
    await store.record_schema("src", "shop.items", [{"name": "id", "type": 3}, {"name": "v", "type": 15}], {})
    source.tables = [DeclaredTable("shop", "items", (("id", "int"), ("v", "text"), ("note", "text")))]
    source.on_schema_drift = "halt"
    await (await reconciler(store, source))._reconcile(None)
    source.server = {"server_id": "2"}
    for _ in range(2):  # a rerun (the halt leaves the old identity) rewrites the same records
        actor = await reconciler(store, source)
        with pytest.raises(
            SourceMisconfigured, match=r"^schema drift detected after failover and on_schema_drift=halt"
        ):
            await actor._reconcile(SeqPosition(5))
        assert sorted(r["kind"] for r in actor.ctx.reconcile_records) == ["failover", "schema_drift"]
    drift = next(r for r in actor.ctx.reconcile_records if r["kind"] == "schema_drift")
    assert drift["drift"] == {"shop.items": {"added": ["note"]}} and drift["result"] == "halted"
    assert actor.ctx.identity == {"server_id": "1"} and source.generation == 0
    source.on_schema_drift = "adapt"
    actor = await reconciler(store, source)
    assert await actor._reconcile(SeqPosition(5)) == "changed"
    drift = next(r for r in actor.ctx.reconcile_records if r["kind"] == "schema_drift")
    assert drift["result"] == "adapted" and source.generation == 1


async def test_a_lost_position_is_recorded_and_raised_and_the_old_identity_kept() -> None:
    store, source = MemoryCheckpointStore(), ServerSource()
    actor = await reconciler(store, source)
    await actor._reconcile(None)
    source.server, source.verdict = {"server_id": "2"}, PositionLost("GTID 0-1-9 is not on the new server")
    with pytest.raises(PositionLost, match=r"^position lost: GTID 0-1-9"):
        await actor._reconcile(SeqPosition(5))
    [record] = actor.ctx.reconcile_records
    assert record["result"] == "position_lost" and "0-1-9" in record["reason"]
    assert actor.ctx.identity == {"server_id": "1"}


async def test_undeterminable_warns_and_continues() -> None:
    store, source = MemoryCheckpointStore(), ServerSource()
    actor = await reconciler(store, source)
    await actor._reconcile(None)
    source.server, source.verdict = {"server_id": "2"}, Undeterminable("a query failed")
    assert await actor._reconcile(SeqPosition(5)) == "changed"
    [record] = actor.ctx.reconcile_records
    assert record["result"] == "undeterminable"
    assert actor.ctx.identity == {"server_id": "2"}


async def test_drift_names_added_removed_and_retyped_columns_and_a_missing_table() -> None:
    from deltaforge.pipeline.drift import describe, schema_drift

    store, source = MemoryCheckpointStore(), ServerSource()
    cols = [
        {"name": "id", "type": "integer"},
        {"name": "qty", "type": "integer"},
        {"name": "v", "type": "text"},
    ]
    await store.record_schema("src", "shop.items", cols, {})
    await store.record_schema("src", "shop.gone", [{"name": "id", "type": "integer"}], {})
    source.tables = [DeclaredTable("shop", "items", (("id", "INTEGER"), ("qty", "bigint"), ("w", "text")))]
    drift = await schema_drift(store, source)
    assert drift == {
        "shop.items": {"added": ["w"], "removed": ["v"], "changed": ["qty: integer -> bigint"]},
        "shop.gone": {"missing": ["table"]},
    }
    assert (
        describe(drift)
        == "shop.gone: missing table; shop.items: added w, removed v, changed qty: integer -> bigint"
    )


class FailingOver(ServerSource):
    """A ServerSource whose connection drops once ``fail_over`` is called, and comes back to
    another server with more rows."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.dropped = False

    def fail_over(self, server: dict[str, str], total: int) -> None:
        self.server, self.total, self.dropped = server, total, True

    async def read(self) -> list[Event]:
        if self.dropped:
            self.dropped = False
            raise Unavailable("connection lost")
        return await super().read()


async def test_a_failover_met_on_a_full_disk_is_recorded_once_there_is_room(tmp_path: Path) -> None:
    """The failover record and the new identity are written before reading from the new server:
    on a full disk the reconciler waits (degraded, naming the store, nothing read) and writes them
    once writes hold. Before, the store's error went up through the reader and restarted the
    pipeline's actors until the restart limit stopped it."""
    storage = {"type": "sqlite", "path": str(tmp_path / "state.db")}
    source, a = FailingOver(10), ScriptedSink("a")
    runner = PipelineRunner(
        config(sinks=[sink_doc("a")], batch={"max_events": 10}, storage=storage),
        sinks={"a": a},
        source=source,
    )
    task = asyncio.create_task(runner.run())
    outages = runner.ctx.availability
    await wait_until(lambda: runner.ctx.stats.events_committed >= 10, what="the first server's rows")
    with file_size_limit(0):  # SQLite: "database or disk is full" / "disk I/O error"
        source.fail_over({"server_id": "2"}, 20)  # the DSN now leads to another server
        await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
        reconnected = restarts(runner.snapshot())  # the tree, once, for the lost connection
        await wait_until(lambda: outages.view()["state_store"]["attempts"] > 5, what="writes tried again")
        assert runner.state == "running" and a.received == list(range(1, 11))
    await wait_until(lambda: runner.ctx.stats.events_committed >= 20, what="the new server's rows")
    await runner.drain()
    await task
    assert a.received == list(range(1, 21))
    assert restarts(runner.snapshot()) == reconnected  # none while the disk was full, nor after
    [record] = await runner.reconcile_records()
    assert record["kind"] == "failover" and record["now"] == {"server_id": "2"}
    store = SqliteCheckpointStore(tmp_path / "state.db")  # what the next start will find
    await store.open()
    assert (await store.get(identity_key("src")) or {})["fields"] == {"server_id": "2"}
    await store.close()


async def test_a_server_that_does_not_answer_the_reconciler_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reader waits for the reconciler without a timeout of its own (a full disk may hold its
    writes for long), so what the reconciler asks the server is bounded: past it, the server is
    unavailable, which is waited for, not a crash."""
    monkeypatch.setattr(reconciler_module, "ANSWER_TIMEOUT_S", 0.05)
    answer = anyio.Event()

    class SilentServer(ServerSource):
        async def identity(self) -> dict[str, str] | None:
            await answer.wait()  # never set: the server took the question and went quiet
            return None

    actor = await reconciler(MemoryCheckpointStore(), SilentServer())
    with pytest.raises(Unavailable, match=r"the server did not answer the reconciler within 0.05 s"):
        await actor._reconcile(None)
