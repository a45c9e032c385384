"""Shared by the backlog benchmarks: time a pipeline draining a known number of events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from deltaforge import gctune
from deltaforge.config import parse_pipeline
from deltaforge.pipeline.context import PipelineStats
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.base import Source
from deltaforge.state.checkpoints import MemoryCheckpointStore


async def drain_rate(
    doc: dict[str, Any],
    events: int,
    source: Source | None = None,
    done: Callable[[PipelineStats], bool] | None = None,
) -> float:
    """Events/s from start until ``events`` are committed (or ``done``), with ``serve``'s GC settings."""
    gctune.tune()
    runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), source=source)
    finished = done or (lambda stats: stats.events_committed >= events)
    t0 = time.perf_counter()
    task = asyncio.create_task(runner.run())
    while not finished(runner.ctx.stats):
        await asyncio.sleep(0.01)
        if task.done():
            raise RuntimeError(f"pipeline ended: {runner.failure}")
    elapsed = time.perf_counter() - t0
    await runner.drain()
    await task
    return events / elapsed
