"""A table added to a source's ``tables`` while the pipeline has checkpoints: the rows it
already had are copied by a snapshot when the snapshot mode copies rows, and named (with the
command that copies them) with ``never``; its changes stream from the start either way."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.snapshot.listed import ListedTables
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.mysql.snapshot import MySQLChunks
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.kit import SyntheticSource, config
from tests.test_sink_added import Received, Tables, items, reader_running, replayed, run_until

__all__ = ["items"]  # the fixture, parametrized below


@pytest.mark.parametrize("items", ["mariadb", "postgres", "turso"], indirect=True)
@pytest.mark.parametrize("mode", ["never", "initial"])
async def test_a_table_added_to_tables_has_its_rows_copied_or_named(items: Tables, mode: str) -> None:
    items.write("CREATE TABLE other (id bigint PRIMARY KEY)")
    items.write("INSERT INTO other VALUES (10), (11)")
    config = {**items.source["config"], "snapshot": {"mode": mode}}
    store, got = MemoryCheckpointStore(), Received()
    first = {**items.source, "config": config}
    await run_until(first, ["a"], store, got, lambda _: 1 in replayed(got["a"]),
                    then=lambda: items.write("INSERT INTO items VALUES (1)"))  # fmt: skip
    assert "a:other" not in got  # not captured yet
    second = {**items.source, "config": {**config, "tables": [*config["tables"], items.qualified("other")]}}
    with capture_logs() as logs:
        await run_until(second, ["a"], store, got, lambda _: 12 in replayed(got.get("a:other", [])),
                        then=lambda: items.write("INSERT INTO other VALUES (12)"))  # fmt: skip
    named = [e for e in logs if e["event"] == "tables_added_not_copied"]
    if mode == "never":
        assert got["a:other"] == [("c", 12)]
        assert [e["tables"] for e in named] == [[items.qualified("other")]], logs
        assert "deltaforge snapshot added" in named[0]["fix"]
    else:
        assert replayed(got["a:other"]) == {10, 11, 12}, got["a:other"]
        assert ("r", 10) in got["a:other"] and not named
    with capture_logs() as logs:  # once: the list is remembered
        await run_until(second, ["a"], store, got, reader_running)
    assert not [e for e in logs if e["event"] in ("tables_added_not_copied", "snapshot_requested")]


@pytest.mark.parametrize("items", ["mariadb"], indirect=True)
async def test_a_server_down_as_an_added_table_is_looked_up_asks_again_at_the_reconnect(
    items: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server goes away just as the start asks it for the added table (the first call of
    ``tables`` for it fails as unavailable): the reconnect asks again, and the rows come."""
    items.write("CREATE TABLE other (id bigint PRIMARY KEY)")
    items.write("INSERT INTO other VALUES (10), (11)")
    config = {**items.source["config"], "snapshot": {"mode": "initial"}}
    store, got = MemoryCheckpointStore(), Received()
    await run_until({**items.source, "config": config}, ["a"], store, got, reader_running)
    failed: list[list[str] | None] = []
    looked_up = MySQLChunks.tables

    async def down_once(self: MySQLChunks, names: list[str] | None) -> list[TableRef]:
        if names and items.qualified("other") in names and not failed:
            failed.append(names)
            raise SourceUnavailable("the server went away (injected)")
        return await looked_up(self, names)

    monkeypatch.setattr(MySQLChunks, "tables", down_once)
    second = {**items.source, "config": {**config, "tables": [*config["tables"], items.qualified("other")]}}
    await run_until(second, ["a"], store, got, lambda _: replayed(got.get("a:other", [])) == {10, 11})
    assert failed == [[items.qualified("other")]]


async def test_a_list_narrowed_from_every_table_adds_none() -> None:
    """``tables`` empty means every table: a later list names tables that were captured already,
    so none of them is new (their rows are in the sinks)."""
    store = MemoryCheckpointStore()
    everything = ListedTables(
        store, "s", [], PatientWrites(PipelineContext(config(), store, SyntheticSource(1), {}))
    )
    await everything.remember()
    narrowed = ListedTables(store, "s", ["db.a", "db.b"], everything.writes)
    assert await narrowed.added() == []
