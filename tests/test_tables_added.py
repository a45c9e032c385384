"""A table added to a source's ``tables`` while the pipeline has checkpoints: the rows it
already had are copied by a snapshot when the snapshot mode copies rows, and named (with the
command that copies them) with ``never``; its changes stream from the start either way."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from deltaforge.state.checkpoints import MemoryCheckpointStore
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
