"""One 300,000-row transaction committed while the workload runs, and while it is being delivered
the source's network is cut and serve is SIGKILLed. It goes through in batches as it is read
(``transaction_split``), never held whole: memory stays bounded, and the checkpoints inside it
bring back the rest. Lost 0, order 0, Redis duplicates 0."""

from __future__ import annotations

import threading
import time
from typing import Any

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import Rig, postgres_rig, wait_for
from chaos.scenarios.slow_sink import rss_mb

ROWS = 300_000
RSS_LIMIT_MB = 300
"""Held whole, a 300,000-row transaction took 590 MB (PostgreSQL → file); in pieces about 140."""


def committed(rig: Rig) -> int:
    assert rig.serve is not None
    counters: dict[str, Any] = rig.serve.get("/pipelines/chaos").json()["counters"]
    return int(counters["events_committed"])


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.add_redis(exactly_once=True)
        rig.start(
            batch={"max_events": 1000, "max_ms": 50, "max_tx_events": 10_000}, source={"read_chunk": 1000}
        )
        rig.workload.start()
        rig.progress(0)
        peak = [0.0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                if rig.serve is not None and rig.serve.proc.poll() is None:
                    peak[0] = max(peak[0], rss_mb(rig.serve.proc.pid))
                sampling.wait(0.05)  # the sampling period

        sampler = threading.Thread(target=sample, name="rss", daemon=True)
        sampler.start()
        try:
            before = committed(rig)
            rig.workload.bulk_insert(ROWS, "SELECT g, 1, 'bulk' FROM generate_series(%s, %s) g")
            # Inside the large transaction: its first batches are checkpointed, the rest is not.
            wait_for(
                lambda: committed(rig) > before + ROWS // 10, 60, "part of the large transaction delivered"
            )
            rig.source_proxy.disable()
            wait_for(rig.degraded, 30, "/health degraded")
            time.sleep(3)  # the partition itself
            rig.source_proxy.enable()
            wait_for(lambda: committed(rig) > before + ROWS // 2, 120, "half of it delivered")
            rig.restart()
            rig.verify(recover_timeout=240)
        finally:
            sampling.set()
            sampler.join(5)
        ctx.figures["peak_rss_mb"] = round(peak[0], 1)
        if peak[0] > RSS_LIMIT_MB:
            raise Failed(
                f"serve and its children grew to {peak[0]:.0f} MB delivering a {ROWS:,}-row transaction"
            )
        split = (ctx.workdir / "log.jsonl").read_text().count('"transaction_split"')
        ctx.figures["transaction_split logged"] = split
        if not split:
            raise Failed("the large transaction was never split across batches")
