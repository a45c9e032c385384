"""Shared by the backlog benchmarks: time a pipeline draining a known number of events."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from deltaforge import gctune
from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore


async def drain_rate(doc: dict[str, Any], events: int) -> float:
    """Events/s from start until ``events`` are committed, with the GC settings ``serve`` uses."""
    gctune.tune()
    runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore())
    t0 = time.perf_counter()
    task = asyncio.create_task(runner.run())
    while runner.ctx.stats.events_committed < events:
        await asyncio.sleep(0.01)
        if task.done():
            raise RuntimeError(f"pipeline ended: {runner.failure}")
    elapsed = time.perf_counter() - t0
    await runner.drain()
    await task
    return events / elapsed
