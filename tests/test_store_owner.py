"""Pipelines sharing a checkpoint store (the default ``spec.storage.path``) must not share a
source id: the store keeps checkpoints by it, so the second would read from the first one's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from tests.helpers import wait_until
from tests.kit import doc
from tests.test_turso_source import written


def pipeline(tmp: Path, name: str, source_id: str, db: str) -> PipelineRunner:
    d = doc(name=name, storage={"type": "sqlite", "path": str(tmp / "shared.db")}, source_path=str(tmp / db))
    d["spec"]["source"]["config"]["id"] = source_id
    return PipelineRunner(parse_pipeline(d, env={}))


async def started(runner: PipelineRunner) -> asyncio.Task[None]:
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.state in ("running", "failed"), timeout=30, what="the pipeline started")
    return task


async def stopped(runner: PipelineRunner, task: asyncio.Task[None]) -> None:
    runner.stop_now()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_second_pipeline_with_the_same_source_id_in_the_same_store_is_refused(tmp_path: Path) -> None:
    orders = pipeline(tmp_path, "orders", "db", "orders.db")
    task = await started(orders)
    assert orders.state == "running"
    billing = pipeline(tmp_path, "billing", "db", "billing.db")
    other = await started(billing)
    await stopped(billing, other)  # it ended by itself, or it ran on orders' checkpoints
    assert billing.state == "failed"
    assert billing.failure is not None and billing.failure.startswith(
        "spec.source.config.id: source id 'db' belongs to pipeline 'orders'"
    )
    assert str(tmp_path / "shared.db") in billing.failure
    # Another id in the same store is fine, and so is the owner's next start.
    billing = pipeline(tmp_path, "billing", "billing_db", "billing.db")
    other = await started(billing)
    assert billing.state == "running"
    await stopped(billing, other)
    await stopped(orders, task)
    orders = pipeline(tmp_path, "orders", "db", "orders.db")
    task = await started(orders)
    assert orders.state == "running"
    await stopped(orders, task)


async def test_pipelines_claiming_one_source_id_at_once_leave_exactly_one_running(tmp_path: Path) -> None:
    """Started together (a serve with several config documents), each on its own connection to
    the store: one claim stands, the others are refused by name (before, SQLite's versioned rows
    clashed and each failed as a store that cannot be opened)."""
    runners = [pipeline(tmp_path, f"p{i}", "db", f"p{i}.db") for i in range(4)]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    try:
        await wait_until(
            lambda: all(r.state in ("running", "failed") for r in runners), timeout=30, what="all started"
        )
        states = sorted(r.state for r in runners)
        assert states == ["failed", "failed", "failed", "running"], [(r.state, r.failure) for r in runners]
        owner = next(r.name for r in runners if r.state == "running")
        for r in runners:
            assert r.failure is None or r.failure.startswith(
                f"spec.source.config.id: source id 'db' belongs to pipeline {owner!r}"
            ), r.failure
    finally:
        for r, t in zip(runners, tasks, strict=True):
            await stopped(r, t)


async def test_a_pipeline_whose_source_id_changed_is_refused_while_the_old_id_holds_its_checkpoints(
    tmp_path: Path,
) -> None:
    """A pipeline's source given another ``id`` (a rename in the config) finds no checkpoint under
    it: started so, the pipeline would be a new one, reading from now (``snapshot.mode: never``,
    the default: whatever changed while it was stopped skipped) or from the beginning. It is
    refused, naming both ids, until the source has its id back or the old checkpoints are
    forgotten. Before, it started as a new pipeline without a word."""
    db = tmp_path / "orders.db"
    w = written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", "INSERT INTO t VALUES (1, 'a')")
    w.close()
    orders = pipeline(tmp_path, "orders", "db", "orders.db")
    task = await started(orders)
    store = orders.store
    await wait_until(lambda: orders.ctx.stats.events_committed >= 1, what="the row committed")
    await stopped(orders, task)

    renamed = pipeline(tmp_path, "orders", "orders_db", "orders.db")
    other = await started(renamed)
    await stopped(renamed, other)
    assert renamed.state == "failed"
    assert renamed.failure is not None and renamed.failure.startswith(
        "spec.source.config.id: pipeline 'orders' has checkpoints under source id 'db' in the sqlite store"
    ), renamed.failure
    assert "'orders_db'" in renamed.failure and "--forget db::sink::a" in renamed.failure
    # Nothing claimed: the old id back, the pipeline starts from its checkpoints.
    orders = pipeline(tmp_path, "orders", "db", "orders.db")
    task = await started(orders)
    assert orders.state == "running"
    await stopped(orders, task)
    # The old checkpoints forgotten (another database now, say): the new id starts.
    await store.open()
    await store.delete_keys(["db::sink::a"])
    await store.close()
    renamed = pipeline(tmp_path, "orders", "orders_db", "orders.db")
    other = await started(renamed)
    assert renamed.state == "running"
    await stopped(renamed, other)
