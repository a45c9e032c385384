"""The FailoverReconciler's bookkeeping, in-process: outcomes, records, and a rerun after a crash."""

from __future__ import annotations

import pytest

from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.reconciler import FailoverReconciler, identity_key
from deltaforge.position import Position
from deltaforge.sources.base import DeclaredTable, PositionLost, SourceMisconfigured, Undeterminable
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.kit import SeqPosition, SyntheticSource, config, sink_doc


class ServerSource(SyntheticSource):
    """A synthetic source behind a server whose identity and reachability the test sets."""

    def __init__(self) -> None:
        super().__init__(10)
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
