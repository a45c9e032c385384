"""Sink throughput: 100k events through the pipeline vs the raw client, in the same run.

    python benchmarks/sinks.py [--events 100000]

Redis: the pipeline (synthetic source -> Redis sink, default and exactly_once)
against bare pipelined XADD of the same payloads with redis-py. NATS: the
pipeline against bare publish_async + all acks awaited per 2000, with nats-py.
Kafka (Tansu): the pipeline, default and exactly_once, against a bare
confluent-kafka idempotent producer (produce + flush per 2000).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis
import structlog

from deltaforge import gctune
from deltaforge.config import parse_pipeline
from deltaforge.envelopes import encode, native
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.kit import SyntheticSource, make_event
from tests.servers.nats import Nats
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu


async def bare_xadd(uri: str, n: int) -> float:
    client = aioredis.from_url(uri)
    events = [make_event(i) for i in range(1, n + 1)]
    t0 = time.perf_counter()
    for start in range(0, n, 2000):
        pipe = client.pipeline(transaction=False)
        for e in events[start : start + 2000]:
            pipe.xadd("bare", {"event": encode(native(e)), "idempotency_key": e.idempotency_key})
        await pipe.execute()
    elapsed = time.perf_counter() - t0
    await client.aclose()
    return n / elapsed


async def bare_publish(url: str, n: int) -> float:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="BARE", subjects=["bare.>"])
    events = [make_event(i) for i in range(1, n + 1)]
    t0 = time.perf_counter()
    for start in range(0, n, 2000):
        futures = [
            await js.publish_async("bare.t", encode(native(e)), headers={"Nats-Msg-Id": e.idempotency_key})
            for e in events[start : start + 2000]
        ]
        await asyncio.gather(*futures)
    elapsed = time.perf_counter() - t0
    await nc.close()
    return n / elapsed


def bare_kafka(bootstrap: str, n: int) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 3})
    events = [make_event(i) for i in range(1, n + 1)]
    t0 = time.perf_counter()
    for start in range(0, n, 2000):
        for e in events[start : start + 2000]:
            while True:
                try:
                    p.produce("bare", encode(native(e)), str(e.after["id"]) if e.after else None,
                              headers=[("idempotency_key", e.idempotency_key.encode())])  # fmt: skip
                    break
                except BufferError:
                    p.poll(0.1)
        p.flush(30)
    return n / (time.perf_counter() - t0)


async def run(sink: dict[str, object], n: int) -> float:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "bench"},
        "spec": {
            "source": {"type": "turso", "config": {"id": "src", "path": "unused.db"}},
            "sinks": [sink],
            "batch": {"max_events": 2000, "max_ms": 50},
        },
    }
    runner = PipelineRunner(
        parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=2000)
    )
    t0 = time.perf_counter()
    task = asyncio.create_task(runner.run())
    while runner.ctx.stats.events_committed < n:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    await runner.drain()
    await task
    return n / elapsed


async def pipeline(uri: str, n: int, exactly_once: bool) -> float:
    stream = f"p{int(exactly_once)}"
    return await run(
        {"type": "redis", "config": {"id": "r", "uri": uri, "stream": stream, "exactly_once": exactly_once}},
        n,
    )


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=100_000)
    args = ap.parse_args()
    gctune.tune()
    with Redis() as server:
        raw = asyncio.run(bare_xadd(server.uri(), args.events))
        pipe = asyncio.run(pipeline(server.uri(), args.events, False))
        eo = asyncio.run(pipeline(server.uri(), args.events, True))
    print(f"redis  {args.events:,} events: pipeline {pipe:>9,.0f}/s | exactly_once {eo:>9,.0f}/s | "
          f"bare pipelined XADD {raw:>9,.0f}/s | ratios {pipe / raw:.0%} / {eo / raw:.0%}")  # fmt: skip
    with Nats() as server:
        raw = asyncio.run(bare_publish(server.url(), args.events))
        sink = {
            "type": "nats",
            "config": {"id": "n", "url": server.url(), "subject": "cdc.${source.table}", "stream": "CDC"},
        }
        pipe = asyncio.run(run(sink, args.events))
    with Tansu() as broker:
        broker.create_topic("bare")
        broker.create_topic("cdc.t")
        raw_k = bare_kafka(broker.bootstrap, args.events)
        sink = {
            "type": "kafka",
            "config": {"id": "k", "brokers": broker.bootstrap, "topic": "cdc.${source.table}"},
        }
        pipe_k = asyncio.run(run(sink, args.events))
        sink["config"] = {**sink["config"], "id": "k2", "exactly_once": True}  # type: ignore[dict-item]
        eo_k = asyncio.run(run(sink, args.events))
    print(f"kafka  {args.events:,} events: pipeline {pipe_k:>9,.0f}/s | exactly_once {eo_k:>9,.0f}/s | "
          f"bare confluent-kafka {raw_k:>9,.0f}/s | ratios {pipe_k / raw_k:.0%} / {eo_k / raw_k:.0%}")  # fmt: skip
    print(f"nats   {args.events:,} events: pipeline {pipe:>9,.0f}/s | bare publish_async {raw:>9,.0f}/s | "
          f"ratio {pipe / raw:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
