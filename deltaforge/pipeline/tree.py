"""One pipeline's supervisor tree — every actor and every restart policy, in one place.

    PipelineSupervisor[name]          strategy/intensity/backoff from spec.supervision
     ├─ CheckpointCommitter           permanent   the only writer of checkpoints
     ├─ DeliverySupervisor            permanent   one_for_one over the workers
     │    └─ DeliveryWorker[sink] x N permanent   retries, classifies, reports
     ├─ DeliveryCoordinator           permanent   fan-out, commit policy, FIFO batches
     ├─ SparkTransformer              permanent   only with processors: Spark jobs, in order
     ├─ Accumulator                   permanent   cuts batches (max_events/bytes/ms, tx)
     ├─ FailoverReconciler            permanent   identifies the server before each source open
     ├─ DemoWorkload                  transient   only for the built-in default pipeline
     └─ SourceReader                  permanent   reads from the minimum sink checkpoint

Children start in this order, each only after the one before it is up (OTP's
start_link): the reader opens the source only once every actor downstream of it,
the SparkTransformer with its checked processors included, is ready.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors import ActorCell, ActorRef
from deltaforge.pipeline.accumulator import Accumulator
from deltaforge.pipeline.committer import CheckpointCommitter
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.coordinator import DeliveryCoordinator
from deltaforge.pipeline.delivery import DeliveryWorker
from deltaforge.pipeline.messages import Barrier, FlushNow
from deltaforge.pipeline.reader import SourceReader
from deltaforge.pipeline.reconciler import FailoverReconciler
from supervision import Backoff, ChildSpec, FunctionChild, Intensity, Restart, Strategy, Supervisor

if TYPE_CHECKING:
    from deltaforge.pipeline.transformer import SparkTransformer


SPARK_EXTRA = "processors need the spark extra: pip install 'deltaforge[spark]' (and a Java 17 runtime)"


class MissingExtra(RuntimeError):
    """The pipeline needs an optional dependency that is not installed."""


@dataclass(frozen=True, slots=True)
class PipelineTree:
    """The running tree and the refs the runner talks to (to drain it)."""

    supervisor: Supervisor
    reader: ActorRef[SourceReader]
    accumulator: ActorRef[Accumulator]
    transformer: ActorRef[SparkTransformer] | None
    coordinator: ActorRef[DeliveryCoordinator]
    workers: dict[str, ActorRef[DeliveryWorker]]

    async def deliver_buffered(self, timeout: float) -> None:
        """Everything handed past the reader delivered and checkpointed (the drain's middle)."""
        await deliver_buffered(self.accumulator, self.transformer, self.coordinator, timeout)


def build_tree(ctx: PipelineContext, extra: list[ChildSpec] | None = None) -> PipelineTree:
    """The whole supervisor tree of one pipeline.

    Actors are built downstream first, so each gets the refs it talks to as typed
    constructor arguments. ``extra`` children (the demo workload) start after the
    data path is up and before the reader. Children start in the order listed,
    each after the one before it is up (its ``on_start`` returned).
    """
    cfg = ctx.config
    sup = cfg.supervision
    intensity = Intensity(sup.max_restarts, sup.within_seconds)
    backoff = Backoff(sup.backoff_base_ms / 1000, sup.backoff_max_ms / 1000)

    committer: ActorCell[CheckpointCommitter] = ActorCell(
        "CheckpointCommitter", lambda: CheckpointCommitter(ctx)
    )
    worker_cells: dict[str, ActorCell[DeliveryWorker]] = {
        sid: ActorCell(f"DeliveryWorker[{sid}]", _WorkerFactory(ctx, sid)) for sid in ctx.sinks
    }
    delivery = Supervisor(
        "DeliverySupervisor",
        [ChildSpec(cell) for cell in worker_cells.values()],
        strategy=Strategy.ONE_FOR_ONE,
        intensity=intensity,
        backoff=backoff,
        clock=ctx.clock,
        rng=ctx.rng,
    )
    workers = {sid: cell.ref for sid, cell in worker_cells.items()}
    coordinator: ActorCell[DeliveryCoordinator] = ActorCell(
        "DeliveryCoordinator",
        lambda: DeliveryCoordinator(ctx, workers, committer.ref, lambda: reader.ref),
        mailbox_size=DeliveryCoordinator.mailbox_for(cfg.batch.max_inflight),
    )
    transform: list[ChildSpec] = []
    transformer_ref: ActorRef[SparkTransformer] | None = None
    batches: ActorRef[DeliveryCoordinator] | ActorRef[SparkTransformer] = coordinator.ref
    if cfg.processors:
        try:
            import pyarrow  # noqa: F401 - both come with the spark extra; pyspark is
            import pyspark  # noqa: F401 - otherwise imported only when the session starts

            from deltaforge.pipeline.transformer import SparkTransformer
        except ImportError as exc:
            raise MissingExtra(f"pipeline {cfg.name!r}: {SPARK_EXTRA} ({exc})") from None

        transformer: ActorCell[SparkTransformer] = ActorCell(
            "SparkTransformer", lambda: SparkTransformer(ctx, coordinator.ref)
        )
        transformer_ref = batches = transformer.ref
        # A job is allowed to finish when the pipeline stops; Spark cannot cancel it from here.
        transform.append(ChildSpec(transformer, shutdown_timeout=30.0))
    accumulator: ActorCell[Accumulator] = ActorCell("Accumulator", lambda: Accumulator(ctx, batches))
    reconciler: ActorCell[FailoverReconciler] = ActorCell(
        "FailoverReconciler", lambda: FailoverReconciler(ctx)
    )

    async def settle(timeout: float) -> None:
        await deliver_buffered(accumulator.ref, transformer_ref, coordinator.ref, timeout)

    reader: ActorCell[SourceReader] = ActorCell(
        "SourceReader", lambda: SourceReader(ctx, accumulator.ref, reconciler.ref, settle)
    )
    children = [
        ChildSpec(committer),
        ChildSpec(delivery, shutdown_timeout=30.0),
        ChildSpec(coordinator, shutdown_timeout=10.0),
        *transform,
        ChildSpec(accumulator),
        ChildSpec(reconciler),
        *(extra or []),
        ChildSpec(reader),
    ]
    supervisor = Supervisor(
        f"PipelineSupervisor[{cfg.name}]",
        children,
        strategy=Strategy(sup.strategy),
        intensity=intensity,
        backoff=backoff,
        clock=ctx.clock,
        rng=ctx.rng,
        max_unavailable=sup.max_unavailable_s,
    )
    return PipelineTree(supervisor, reader.ref, accumulator.ref, transformer_ref, coordinator.ref, workers)


async def deliver_buffered(
    accumulator: ActorRef[Accumulator],
    transformer: ActorRef[SparkTransformer] | None,
    coordinator: ActorRef[DeliveryCoordinator],
    timeout: float,
) -> None:
    """The accumulator cuts what it holds, the transformer and the coordinator finish every batch
    sent before: what the reader handed over is delivered and checkpointed."""
    await accumulator.ask(FlushNow(), timeout=timeout)
    if transformer is not None:
        await transformer.ask(Barrier(), timeout=timeout)
    await coordinator.ask(Barrier(), timeout=timeout)


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
