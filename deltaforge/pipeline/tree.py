"""One pipeline's supervisor tree — every actor and every restart policy, in one place.

    PipelineSupervisor[name]          strategy/intensity/backoff from spec.supervision
     ├─ CheckpointCommitter           permanent   the only writer of checkpoints
     ├─ DeliverySupervisor            permanent   one_for_one over the workers
     │    └─ DeliveryWorker[sink] x N permanent   retries, classifies, reports
     ├─ DeliveryCoordinator           permanent   fan-out, commit policy, FIFO batches
     ├─ SparkTransformer              permanent   only with processors: Spark jobs, in order
     ├─ Accumulator                   permanent   cuts batches (max_events/bytes/ms, tx)
     ├─ DemoWorkload                  transient   only for the built-in default pipeline
     └─ SourceReader                  permanent   reads from the minimum sink checkpoint

Why the pipeline supervisor is one_for_all or rest_for_one, never one_for_one:
events in flight between reader, accumulator and coordinator live only in
mailboxes. If the accumulator restarted alone, the reader would carry on past
what died with it, a later batch would commit beyond the hole, and events would
be skipped. Restarting everything after the failed actor (rest_for_one) or
everything (one_for_all) makes the reader resume from committed checkpoints,
so a restart costs duplicates at worst, never loss. Delivery workers can restart
alone (one_for_one) because the coordinator re-asks them for the same batch.

The SparkTransformer sits before the Accumulator for the same reason: when a
Spark job fails or the JVM dies, the reader and accumulator restart with it and
the lost batches are read again. Its module (and pyspark) is imported only when
the pipeline has processors, so a pipeline without them never starts a JVM.
"""

from __future__ import annotations

import asyncio

from actors import ActorCell
from deltaforge.pipeline.accumulator import Accumulator
from deltaforge.pipeline.committer import CheckpointCommitter
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.coordinator import DeliveryCoordinator
from deltaforge.pipeline.delivery import DeliveryWorker
from deltaforge.pipeline.reader import SourceReader
from supervision import Backoff, ChildSpec, FunctionChild, Intensity, Restart, Strategy, Supervisor


def build_tree(ctx: PipelineContext, extra: list[ChildSpec] | None = None) -> Supervisor:
    """The whole supervisor tree of one pipeline, wired through ``ctx.refs``.

    ``extra`` children (the demo workload) start after the data path is up and
    before the reader.
    """
    cfg = ctx.config
    sup = cfg.supervision
    intensity = Intensity(sup.max_restarts, sup.within_seconds)
    backoff = Backoff(sup.backoff_base_ms / 1000, sup.backoff_max_ms / 1000)

    def cell(name: str, actor: ActorCell) -> ActorCell:
        ctx.refs[name] = actor.ref
        return actor

    committer = cell("committer", ActorCell("CheckpointCommitter", lambda: CheckpointCommitter(ctx)))
    workers = [
        ChildSpec(cell(f"sink:{sid}", ActorCell(f"DeliveryWorker[{sid}]", _WorkerFactory(ctx, sid))))
        for sid in ctx.sinks
    ]
    delivery = Supervisor(
        "DeliverySupervisor", workers, strategy=Strategy.ONE_FOR_ONE, intensity=intensity, backoff=backoff
    )
    coordinator = cell(
        "coordinator",
        ActorCell(
            "DeliveryCoordinator",
            lambda: DeliveryCoordinator(ctx),
            mailbox_size=DeliveryCoordinator.mailbox_for(cfg.batch.max_inflight),
        ),
    )
    transform: list[ChildSpec] = []
    ctx.refs["batches"] = coordinator.ref
    if cfg.processors:
        from deltaforge.pipeline.transformer import SparkTransformer

        transformer = cell("transformer", ActorCell("SparkTransformer", lambda: SparkTransformer(ctx)))
        ctx.refs["batches"] = transformer.ref
        ctx.ready["transformer"] = asyncio.Event()
        # A job is allowed to finish when the pipeline stops; Spark cannot cancel it from here.
        transform.append(ChildSpec(transformer, shutdown_timeout=30.0))
    accumulator = cell("accumulator", ActorCell("Accumulator", lambda: Accumulator(ctx)))
    reader = cell("reader", ActorCell("SourceReader", lambda: SourceReader(ctx)))
    children = [
        ChildSpec(committer),
        ChildSpec(delivery, shutdown_timeout=30.0),
        ChildSpec(coordinator, shutdown_timeout=10.0),
        *transform,
        ChildSpec(accumulator),
        *(extra or []),
        ChildSpec(reader),
    ]
    return Supervisor(
        f"PipelineSupervisor[{cfg.name}]",
        children,
        strategy=Strategy(sup.strategy),
        intensity=intensity,
        backoff=backoff,
    )


def _worker(ctx: PipelineContext, sink_id: str) -> type[DeliveryWorker] | _WorkerFactory:
    return _WorkerFactory(ctx, sink_id)


class _WorkerFactory:
    """Builds a fresh DeliveryWorker for each (re)start of one sink's cell."""

    def __init__(self, ctx: PipelineContext, sink_id: str) -> None:
        self.ctx = ctx
        self.sink_id = sink_id

    def __call__(self) -> DeliveryWorker:
        return DeliveryWorker(self.ctx, self.sink_id)


def workload_child(run: FunctionChild) -> ChildSpec:
    """The demo workload as a transient child (a normal end is not restarted)."""
    return ChildSpec(run, restart=Restart.TRANSIENT, shutdown_timeout=10.0)
