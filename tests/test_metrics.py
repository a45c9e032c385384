"""GET /metrics: Prometheus text that parses, with counters and histograms that move by what a
pipeline did (issue 16, acceptance 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from deltaforge.api import build_app
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import RetryableSinkError
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until, wait_until_sync
from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc
from tests.serve_proc import Serve, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(runners: dict[str, PipelineRunner]) -> Samples:
    app = build_app(runners)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        resp = await client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        assert family.name.startswith("deltaforge_"), family.name
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples) -> Callable[..., float]:
    return lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)


async def test_counters_and_histograms_move_by_what_the_pipeline_did() -> None:
    n, chunk, max_events = 2_000, 100, 250
    failures = iter([RetryableSinkError("down a moment")])

    def flaky(call: int, events: list[Any]) -> None:
        if call == 2:
            raise next(failures)

    a, b = ScriptedSink("a"), ScriptedSink("b", script=flaky)
    cfg = config(
        sinks=[sink_doc("a"), sink_doc("b")], name="m1", batch={"max_events": max_events, "max_ms": 10_000}
    )
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=chunk),
                            sinks={"a": a, "b": b})  # fmt: skip
    before = await scrape({})
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, what="all committed")
    running = await scrape({"m1": runner})
    await runner.drain()
    await asyncio.wait_for(task, 30)
    after = await scrape({"m1": runner})
    d = moved(before, after)

    assert value(running, "deltaforge_pipeline_status", pipeline="m1") == 1.0
    assert value(after, "deltaforge_pipeline_status", pipeline="m1") == 0.0
    assert value(after, "deltaforge_source_events_total", pipeline="m1", source="src") == n
    assert value(after, "deltaforge_source_bytes_total", pipeline="m1", source="src") == n * 100
    assert value(after, "deltaforge_events_committed_total", pipeline="m1") == n
    for sink in ("a", "b"):
        assert value(after, "deltaforge_sink_events_total", pipeline="m1", sink=sink) == n
        assert value(after, "deltaforge_sink_batches_total", pipeline="m1", sink=sink) == n / max_events
        assert value(after, "deltaforge_checkpoint_age_seconds", pipeline="m1", sink=sink) >= 0
        assert d("deltaforge_sink_latency_seconds_count", pipeline="m1", sink=sink) == n / max_events
        assert d("deltaforge_end_to_end_latency_seconds_count", pipeline="m1", sink=sink) == n / max_events
    assert value(after, "deltaforge_sink_retries_total", pipeline="m1", sink="b") == 1
    assert value(after, "deltaforge_sink_errors_total", pipeline="m1", sink="b", kind="retryable") == 1
    assert value(after, "deltaforge_sink_errors_total", pipeline="m1", sink="a", kind="retryable") == 0
    # Histograms: one batch observation per batch, summing to every event; stages each observed.
    assert d("deltaforge_batch_events_count", pipeline="m1") == n / max_events
    assert d("deltaforge_batch_events_sum", pipeline="m1") == n
    assert d("deltaforge_batch_bytes_sum", pipeline="m1") == n * 100
    assert d("deltaforge_stage_latency_seconds_count", pipeline="m1", stage="read") == n / chunk
    for stage in ("batch", "deliver", "checkpoint"):
        assert d("deltaforge_stage_latency_seconds_count", pipeline="m1", stage=stage) == n / max_events, (
            stage
        )
    assert (
        d("deltaforge_stage_latency_seconds_bucket", pipeline="m1", stage="deliver", le="+Inf")
        == n / max_events
    )
    # Actors: every mailbox has its bound; the lag gauge names the table.
    assert value(running, "deltaforge_actor_mailbox_capacity", pipeline="m1", actor="Accumulator") == 4
    assert (
        "deltaforge_source_lag_seconds",
        (("pipeline", "m1"), ("source", "src"), ("table", "db.t")),
    ) in after
    assert value(after, "deltaforge_build_info", version="0.1.0") == 1


async def test_restarts_are_counted_by_actor_and_reason() -> None:
    crashes = iter([RuntimeError("boom"), RuntimeError("boom again")])

    def crashing(call: int, events: list[Any]) -> None:
        if call <= 2:
            raise next(crashes)

    sink = ScriptedSink("a", script=crashing)
    runner = PipelineRunner(config(sinks=[sink_doc("a")], name="m2"), store=MemoryCheckpointStore(),
                            source=SyntheticSource(300, chunk=100), sinks={"a": sink})  # fmt: skip
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 300, what="all committed")
    samples = await scrape({"m2": runner})
    await runner.drain()
    await asyncio.wait_for(task, 30)
    restarts = {
        dict(labels)["actor"]: (dict(labels)["reason"], v)
        for (name, labels), v in samples.items()
        if name == "deltaforge_actor_restarts_total" and dict(labels)["pipeline"] == "m2"
    }
    assert restarts == {"DeliveryWorker[a]": ("RuntimeError", 2)}


def test_serve_exposes_metrics_on_the_api_and_on_its_own_address(tmp_path: Path) -> None:
    port = free_port()
    with Serve(tmp_path, "--metrics-addr", f"127.0.0.1:{port}") as serve:
        serve.wait_api()
        wait_until_sync(
            lambda: serve.get("/pipelines/demo").json()["counters"]["events_committed"] > 0, what="a commit"
        )
        for text in (serve.get("/metrics").text, httpx.get(f"http://127.0.0.1:{port}/metrics").text):
            families = {f.name: f for f in text_string_to_metric_families(text)}
            [read] = [
                s for s in families["deltaforge_source_events"].samples if s.labels["pipeline"] == "demo"
            ]
            assert read.value > 0
            assert "deltaforge_process_resident_memory_bytes" in families
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 404  # metrics only there
        assert serve.terminate() == 0


async def test_the_grafana_dashboard_queries_only_metrics_deltaforge_exports() -> None:
    """compose/grafana/dashboards/deltaforge.json: every deltaforge_* series in its queries is one
    /metrics serves once a pipeline has run (histograms by their _bucket/_sum/_count series)."""
    import json
    import re

    runner = PipelineRunner(config(sinks=[sink_doc("a")], name="g", journal={"enabled": True}),
                            store=MemoryCheckpointStore(), source=SyntheticSource(100, chunk=50),
                            sinks={"a": ScriptedSink("a")})  # fmt: skip
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 100, what="all committed")
    await runner.drain()
    await task
    app = build_app({"g": runner})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        text = (await client.get("/metrics")).text
    suffixes = {
        "counter": [""],  # its TYPE line already names the _total series
        "histogram": ["_bucket", "_sum", "_count"],
        "gauge": [""],
        "info": ["_info"],
    }
    exported = {
        name + suffix
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
        for suffix in suffixes.get(kind, [""])
    }
    dashboard = json.loads(
        (Path(__file__).parents[1] / "compose/grafana/dashboards/deltaforge.json").read_text()
    )
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"deltaforge_[a-z_]+", target["expr"])
    }
    assert len(queried) >= 12
    assert queried <= exported, queried - exported
