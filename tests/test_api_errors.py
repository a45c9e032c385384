"""Every error of the REST API is ``{"code", "message"}``: the pipeline endpoints answered an
unknown pipeline with ``{"error": ...}`` where the lifecycle, snapshot and journal endpoints
answer ``{"code": "not_found", "message": ...}`` for the same thing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from deltaforge.api import build_app
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.sqlite_store import SqliteCheckpointStore
from tests.helpers import wait_until
from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc

PATHS = ["/pipelines/nope", "/pipelines/nope/actors", "/pipelines/nope/checkpoints", "/pipelines/nope/identity",
         "/pipelines/nope/schemas", "/pipelines/nope/journal/dlq", "/pipelines/nope/snapshots"]  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
async def test_an_unknown_pipeline_is_not_found_in_the_apis_own_words(path: str) -> None:
    app = build_app({})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        resp = await client.get(path)
    assert resp.status_code == 404, resp.text
    assert resp.json() == {"code": "not_found", "message": "no pipeline named 'nope'"}


async def test_a_stopped_pipelines_stored_state_is_a_conflict_in_the_apis_own_words(tmp_path: Path) -> None:
    """Its state store closed once it stopped (as ``serve`` closes a stopped pipeline's)."""
    sink = ScriptedSink("a")
    store = SqliteCheckpointStore(tmp_path / "cp.db")
    await store.open()
    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=store, source=SyntheticSource(5),
                            sinks={"a": sink})  # fmt: skip
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: sink.received == list(range(1, 6)), what="everything delivered")
    await runner.drain()
    await task
    await store.close()
    app = build_app({"p": runner})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        resp = await client.get("/pipelines/p/checkpoints")
    assert resp.status_code == 409, resp.text
    assert resp.json()["code"] == "stopped" and set(resp.json()) == {"code", "message"}
