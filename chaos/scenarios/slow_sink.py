"""A slow sink (Redis behind 20 KB/s and 50 ms of latency) while rows are written faster than it
takes them: backpressure reaches the source, serve's memory stays bounded, nothing is lost."""

from __future__ import annotations

import time

import psutil

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import postgres_rig

RSS_LIMIT_MB = 400
READ_CHUNK = 100
AHEAD_LIMIT = 3_000
"""What backpressure allows ahead of delivery, with reads of about READ_CHUNK events (a read
takes what the decoder has, up to about twice that) and batches of 200: the coordinator's batch
in delivery and the one in its mailbox, the accumulator's buffer and its four queued reads, the
reader's own read: about 1,600 events. Without backpressure the reader takes everything written
(about 5,000 events in 20 s). With the default read_chunk (5,000) the bound is above what the
scenario writes, and the figure (400 to 3,300 seen) said nothing."""


def rss_mb(pid: int) -> float:
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / 1e6


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        serve = rig.start(source={"read_chunk": READ_CHUNK})
        assert redis.proxy is not None
        redis.proxy.add_toxic(type="bandwidth", stream="upstream", attributes={"rate": 20})
        redis.proxy.add_toxic(type="latency", attributes={"latency": 50})
        rig.workload.start(per_second=200)
        peak = 0.0
        deadline = time.monotonic() + (ctx.duration or 20)
        while time.monotonic() < deadline:
            peak = max(peak, rss_mb(serve.proc.pid))
            time.sleep(0.5)  # sampling interval
        ctx.figures["peak_rss_mb"] = round(peak, 1)
        if peak > RSS_LIMIT_MB:
            raise Failed(f"serve and its children grew to {peak:.0f} MB behind a slow sink")
        counters = serve.get("/pipelines/chaos").json()["counters"]
        ahead = counters["events_read"] - counters["events_committed"]
        ctx.figures["read_ahead_of_commit"] = ahead
        if ahead > AHEAD_LIMIT:
            raise Failed(f"the reader ran {ahead} events ahead of delivery: no backpressure")
        redis.proxy.destroy_toxic("bandwidth_upstream")
        redis.proxy.destroy_toxic("latency_downstream")
        rig.verify()
