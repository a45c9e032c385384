"""Prometheus metrics (prometheus-client), every name prefixed ``deltaforge_``.

Two kinds:

* Histograms and the source-lag gauge are observed where the work happens, once
  per chunk or batch (never per event: at 70k events/s a per-event observation
  would cost more than the event). Actors take their labelled children once, at
  construction (:class:`StageTimers`).
* Everything that is already counted — pipeline and sink counters, checkpoint age,
  mailbox depth, restarts — is read at scrape time by :class:`PipelinesCollector`
  from the pipelines' own stats and supervisor tree, so counting costs nothing extra.

Example::

    >>> from deltaforge.metrics import render
    >>> b"deltaforge_build_info" in render({})
    True
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Histogram, Info, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deltaforge import __version__

if TYPE_CHECKING:
    from actors import NodeSnapshot
    from deltaforge.pipeline.runner import PipelineRunner

REGISTRY = CollectorRegistry(auto_describe=True)
"""What actors observe into; :func:`render` adds the pipelines' live counters to it."""

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
STAGE_SECONDS = Histogram(
    "deltaforge_stage_latency_seconds",
    "Time spent in each stage, per chunk or batch: read, batch (first event buffered to batch cut), "
    "transform, deliver (all sinks acknowledged), checkpoint (store write).",
    ["pipeline", "stage"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
SINK_SECONDS = Histogram(
    "deltaforge_sink_latency_seconds",
    "Time one sink took to acknowledge a batch, retries included.",
    ["pipeline", "sink"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
END_TO_END_SECONDS = Histogram(
    "deltaforge_end_to_end_latency_seconds",
    "Source commit to sink acknowledgement, per batch for its oldest event.",
    ["pipeline", "sink"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
BATCH_EVENTS = Histogram(
    "deltaforge_batch_events",
    "Events per batch.",
    ["pipeline"],
    buckets=(1, 10, 50, 100, 500, 1000, 2000, 5000, 10_000, 50_000),
    registry=REGISTRY,
)
BATCH_BYTES = Histogram(
    "deltaforge_batch_bytes",
    "Bytes per batch (events' estimated in-memory size).",
    ["pipeline"],
    buckets=(1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26),
    registry=REGISTRY,
)
SOURCE_LAG_SECONDS = Gauge(
    "deltaforge_source_lag_seconds",
    "Commit time to read time of the last event read, per table.",
    ["pipeline", "source", "table"],
    registry=REGISTRY,
)
_BUILD = Info("deltaforge_build", "The running deltaforge.", registry=REGISTRY)
_BUILD.info({"version": __version__})
ProcessCollector(namespace="deltaforge", registry=REGISTRY)

STATUS_VALUE = {"running": 1.0, "degraded": 0.75, "paused": 0.5, "draining": 0.5, "starting": 0.0,
                "stopped": 0.0, "failed": -1.0}  # fmt: skip
"""The pipeline status gauge: running 1, degraded 0.75, paused 0.5, stopped 0, failed -1."""


class StageTimers:
    """One pipeline's labelled histogram children, taken once."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.read = STAGE_SECONDS.labels(pipeline, "read")
        self.batch = STAGE_SECONDS.labels(pipeline, "batch")
        self.transform = STAGE_SECONDS.labels(pipeline, "transform")
        self.deliver = STAGE_SECONDS.labels(pipeline, "deliver")
        self.checkpoint = STAGE_SECONDS.labels(pipeline, "checkpoint")
        self.batch_events = BATCH_EVENTS.labels(pipeline)
        self.batch_bytes = BATCH_BYTES.labels(pipeline)


def forget(pipeline: str) -> None:
    """A deleted pipeline's series gone from the labelled metrics kept between scrapes: left,
    they stayed in every scrape until the process ended (its lag frozen at its last value, under
    alerts and dashboards), and a pipeline created again under the name went on from them."""
    for metric in (
        STAGE_SECONDS,
        SINK_SECONDS,
        END_TO_END_SECONDS,
        BATCH_EVENTS,
        BATCH_BYTES,
        SOURCE_LAG_SECONDS,
    ):
        metric.remove_by_labels({"pipeline": pipeline})


def observe_lag(pipeline: str, source: str, table: str, ts_ms: int) -> None:
    if ts_ms > 0:
        SOURCE_LAG_SECONDS.labels(pipeline, source, table).set(max(0.0, time.time() - ts_ms / 1000))


_SINK_COUNTERS = (  # deltaforge_sink_<name>_total: (name, help, SinkStats attribute)
    ("events", "Events delivered.", "events"),
    ("bytes", "Bytes delivered.", "bytes"),
    ("batches", "Batches delivered.", "batches"),
    ("retries", "Delivery attempts retried.", "retries"),
    ("transaction_commits", "Sink transactions committed.", "txn_commits"),
    ("transaction_aborts", "Sink transactions aborted.", "txn_aborts"),
    ("dead_letters", "Poison events a sink sent to the DLQ.", "dead_letters"),
    (
        "lost_acknowledged",
        "Times the sink's server was found without entries it had acknowledged.",
        "lost_acknowledged",
    ),
)


class PipelinesCollector(Collector):
    """The pipelines' own counters and tree, read at scrape time."""

    def __init__(self, pipelines: Mapping[str, PipelineRunner]) -> None:
        self.pipelines = pipelines

    def collect(self) -> Iterator[Metric]:
        p_labels = ["pipeline"]
        status = GaugeMetricFamily("deltaforge_pipeline_status", "running 1, degraded 0.75, paused 0.5, "
                                   "stopped 0, failed -1", labels=p_labels)  # fmt: skip
        committed = CounterMetricFamily("deltaforge_events_committed", "Events whose checkpoint is written.",
                                        labels=p_labels)  # fmt: skip
        commit_failures = CounterMetricFamily("deltaforge_commit_failures", "Batches the commit policy "
                                              "was not met for (retried).", labels=p_labels)  # fmt: skip
        s_labels = ["pipeline", "source"]
        src_events = CounterMetricFamily("deltaforge_source_events", "Events read.", labels=s_labels)
        src_bytes = CounterMetricFamily("deltaforge_source_bytes", "Bytes read (estimated).", labels=s_labels)
        src_errors = CounterMetricFamily("deltaforge_source_errors", "Failed reads.", labels=s_labels)
        src_reconnects = CounterMetricFamily("deltaforge_source_reconnects", "Openings of the source after "
                                             "the first.", labels=s_labels)  # fmt: skip
        src_retained = GaugeMetricFamily("deltaforge_source_retained_bytes", "Log the source server keeps "
                                         "for the pipeline (PostgreSQL: WAL its slot holds; MySQL/MariaDB: binlog bytes from the checkpoint on).", labels=s_labels)  # fmt: skip
        k_labels = ["pipeline", "sink"]
        sink_counters = {
            attr: CounterMetricFamily(f"deltaforge_sink_{name}", doc, labels=k_labels)
            for name, doc, attr in _SINK_COUNTERS
        }
        sink_errors = CounterMetricFamily("deltaforge_sink_errors", "Failed delivery attempts, by kind.",
                                          labels=[*k_labels, "kind"])  # fmt: skip
        age = GaugeMetricFamily("deltaforge_checkpoint_age_seconds", "Since the sink's checkpoint was last "
                                "written in this run.", labels=k_labels)  # fmt: skip
        a_labels = ["pipeline", "actor"]
        depth = GaugeMetricFamily("deltaforge_actor_mailbox_depth", "Messages waiting.", labels=a_labels)
        capacity = GaugeMetricFamily("deltaforge_actor_mailbox_capacity", "Mailbox bound.", labels=a_labels)
        restarts = CounterMetricFamily("deltaforge_actor_restarts", "Restarts, by why.",
                                       labels=[*a_labels, "reason"])  # fmt: skip
        dlq_entries = GaugeMetricFamily("deltaforge_dlq_entries", "Dead letters kept.", labels=p_labels)
        dlq_events = CounterMetricFamily("deltaforge_dlq_events", "Dead letters, by what became of them: added, "
                                         "rejected (full, reject), dropped (full or too old), replayed.",
                                         labels=[*p_labels, "outcome"])  # fmt: skip
        snap_rows = CounterMetricFamily("deltaforge_snapshot_rows", "Snapshot rows emitted by this process.",
                                        labels=p_labels)  # fmt: skip
        snap_running = GaugeMetricFamily(
            "deltaforge_snapshot_running", "1 while a snapshot runs.", labels=p_labels
        )
        snap_wait = GaugeMetricFamily("deltaforge_snapshot_window_wait_seconds", "How long the running "
                                      "snapshot's last window waited for its high watermark to come back "
                                      "through the stream (the stream's lag).", labels=p_labels)  # fmt: skip
        t_labels = ["pipeline", "table"]
        snap_done = GaugeMetricFamily("deltaforge_snapshot_table_rows", "Rows of the running snapshot's "
                                      "table delivered so far (checkpointed or not).", labels=t_labels)  # fmt: skip
        snap_estimate = GaugeMetricFamily("deltaforge_snapshot_table_rows_estimate", "The server's estimate "
                                          "of the table's rows.", labels=t_labels)  # fmt: skip
        now = time.time()
        for name, runner in self.pipelines.items():
            snap = runner.ctx.snapshot
            snap_rows.add_metric([name], snap.rows_total)
            snap_running.add_metric([name], 1.0 if snap.running else 0.0)
            if snap.running and snap.waits.last_s is not None:
                snap_wait.add_metric([name], snap.waits.last_s)
            for table, progress in snap.tables.items():
                snap_done.add_metric([name, table], progress.rows)
                snap_estimate.add_metric([name, table], max(progress.estimate, progress.rows))
            if (dlq := runner.ctx.dlq) is not None:
                dlq_entries.add_metric([name], dlq.entries)
                for outcome in ("added", "rejected", "dropped", "replayed"):
                    dlq_events.add_metric([name, outcome], getattr(dlq, outcome))
            st = runner.ctx.stats
            state = "degraded" if runner.degraded else runner.state
            status.add_metric([name], STATUS_VALUE.get(state, 0.0))
            committed.add_metric([name], st.events_committed)
            commit_failures.add_metric([name], st.commit_failures)
            src = [name, runner.config.source.id]
            src_events.add_metric(src, st.events_read)
            src_bytes.add_metric(src, st.bytes_read)
            src_errors.add_metric(src, st.source_errors)
            src_reconnects.add_metric(src, max(0, runner.ctx.epoch - 1))
            if (retained := runner.ctx.source.retained_bytes) is not None:
                src_retained.add_metric(src, retained)
            for sid, sk in st.sinks.items():
                lab = [name, sid]
                for attr, family in sink_counters.items():
                    family.add_metric(lab, getattr(sk, attr))
                for kind, n in sorted(sk.errors_by_kind.items()):
                    sink_errors.add_metric([*lab, kind], n)
                if sk.checkpoint_at is not None:
                    age.add_metric(lab, max(0.0, now - sk.checkpoint_at))
            for node in _walk(runner.snapshot()):
                if node.mailbox_capacity is not None:
                    depth.add_metric([name, node.name], node.mailbox_depth or 0)
                    capacity.add_metric([name, node.name], node.mailbox_capacity)
                for reason, n in node.restart_reasons:
                    restarts.add_metric([name, node.name, reason], n)
        yield from (status, committed, commit_failures, src_events, src_bytes, src_errors, src_reconnects, src_retained,
                    *sink_counters.values(), sink_errors, age,
                    depth, capacity, restarts, dlq_entries, dlq_events,
                    snap_rows, snap_running, snap_done, snap_estimate, snap_wait)  # fmt: skip


def _walk(node: NodeSnapshot) -> Iterable[NodeSnapshot]:
    yield node
    for child in node.children:
        yield from _walk(child)


class _Everything(Collector):
    def __init__(self, pipelines: Mapping[str, PipelineRunner]) -> None:
        self.live = PipelinesCollector(pipelines)

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self.live.collect()


def render(pipelines: Mapping[str, PipelineRunner]) -> bytes:
    """The text exposition of every metric, for ``GET /metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Everything(pipelines))
    return generate_latest(registry)
