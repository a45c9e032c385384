"""NATS JetStream sink against a real private nats-server."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import NonRetryableSinkError
from deltaforge.sinks.nats import NatsSink
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import PacedSource, SyntheticSource, make_event, sink_pipeline
from tests.servers.nats import Nats
from tests.sink_crash import crash_and_recover, outage_and_recover


def nats_doc(url: str, **sink: Any) -> dict[str, Any]:
    config = {"id": "n", "url": url, "subject": "cdc.${source.table}", "stream": "CDC", **sink}
    return sink_pipeline("n", "nats", config)


async def consume(url: str, subject: str, stream: str = "CDC") -> list[dict[str, Any]]:
    """Everything in the stream for ``subject``, read with a pull consumer."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info(stream)
    total = info.state.messages
    sub = await js.pull_subscribe(subject, durable=f"check{random.randrange(10**9)}", stream=stream)
    out: list[dict[str, Any]] = []
    while len(out) < total:
        try:
            msgs = await sub.fetch(1000, timeout=2)
        except nats.errors.TimeoutError:
            break
        for m in msgs:
            doc = orjson.loads(m.data)
            doc["_msg_id"] = m.headers.get("Nats-Msg-Id") if m.headers else None
            out.append(doc)
            await m.ack()
    await nc.close()
    return out


async def test_hundred_thousand_events_complete_in_order(nats_server: Nats) -> None:
    n = 100_000
    cfg = parse_pipeline(nats_doc(nats_server.url()), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=2000))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=120, what="all committed")
    await runner.drain()
    await task
    got = await consume(nats_server.url(), "cdc.t")
    assert [int(d["event_id"]) for d in got] == list(range(1, n + 1))
    assert got[0]["_msg_id"] == got[0]["idempotency_key"]


async def test_replay_within_window_is_deduplicated_by_the_server(nats_server: Nats) -> None:
    cfg = parse_pipeline(nats_doc(nats_server.url()), env={})
    sink = NatsSink(cfg.sinks[0])
    await sink.open()
    batch = [make_event(i) for i in range(1, 51)]
    await sink.deliver(batch)
    await sink.deliver(batch)
    await sink.close()
    assert sink.duplicates == 50
    assert [int(d["event_id"]) for d in await consume(nats_server.url(), "cdc.t")] == list(range(1, 51))


async def test_no_stream_on_subject_is_non_retryable_with_sink_id(nats_server: Nats) -> None:
    cfg = parse_pipeline(
        nats_doc(nats_server.url(), subject="nowhere.${source.table}", create_stream=False), env={}
    )
    sink = NatsSink(cfg.sinks[0])
    await sink.open()
    with pytest.raises(NonRetryableSinkError, match=r"nats sink 'n': no stream listens"):
        await sink.deliver([make_event(1)])
    await sink.close()


async def test_outage_recovers_without_loss(nats_server: Nats) -> None:
    n = 10_000
    store = MemoryCheckpointStore()
    cfg = parse_pipeline(nats_doc(nats_server.url(), ack_timeout_s=1), env={})

    runner = PipelineRunner(cfg, store=store, source=PacedSource(n, chunk=200))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed > 1000, what="some delivered")
    nats_server.kill()
    failures = runner.ctx.stats.commit_failures
    await wait_until(lambda: runner.ctx.stats.commit_failures > failures, timeout=30, what="backing off")
    nats_server.start()
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=60, what="recovered")
    await runner.drain()
    await task
    ids = [int(d["event_id"]) for d in await consume(nats_server.url(), "cdc.t")]
    assert ids == list(range(1, n + 1))  # nothing lost, and the replay was deduplicated


@pytest.mark.slow
def test_sigkill_leaves_no_duplicates_within_the_window(nats_server: Nats, tmp_path: Path) -> None:
    sink = {
        "type": "nats",
        "config": {"id": "n", "url": "${NATS}", "subject": "cdc.${source.table}", "stream": "CDC"},
    }
    rows = crash_and_recover(tmp_path, sink, {"NATS": nats_server.url()}, kills=6, seed=8)
    got = [int(d["source"]["change_id"]) for d in asyncio.run(consume(nats_server.url(), "cdc.orders"))]
    assert len(got) == len(set(got)), "a change was stored twice within the duplicate window"
    assert got == [int(r[0]) for r in rows]


@pytest.mark.slow
def test_server_stopped_for_a_minute_is_waited_for_and_nothing_is_lost(
    nats_server: Nats, tmp_path: Path
) -> None:
    sink = {
        "type": "nats",
        "config": {"id": "n", "url": "${NATS}", "subject": "out.${source.table}", "stream": "OUTAGE",
                   "stream_subjects": "out.>", "ack_timeout_s": 2},
    }  # fmt: skip
    rows = outage_and_recover(
        tmp_path, sink, {"NATS": nats_server.url()}, nats_server.kill, nats_server.start
    )
    got = [
        int(d["source"]["change_id"]) for d in asyncio.run(consume(nats_server.url(), "out.orders", "OUTAGE"))
    ]
    assert len(got) == len(set(got)), "a change was stored twice within the duplicate window"
    assert got == [int(r[0]) for r in rows]  # every change, in order, none lost
