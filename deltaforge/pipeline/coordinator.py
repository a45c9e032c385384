"""DeliveryCoordinator: fans a batch out to every sink and applies the commit policy."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from actors import Actor, ActorRef, ActorStopped
from deltaforge.config import CommitPolicy
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import (
    Barrier,
    Batch,
    BatchDelivered,
    CommitCheckpoint,
    DeliverBatch,
    DeliverTo,
    DeliveryFailed,
)
from supervision import Backoff, Fatal

if TYPE_CHECKING:
    from deltaforge.pipeline.committer import CheckpointCommitter
    from deltaforge.pipeline.delivery import DeliveryWorker

ASK_TIMEOUT = 120.0


class DeliveryAbandoned(Exception):
    """A sink the commit policy needs failed in a way that retrying cannot fix."""


def policy_satisfied(policy: CommitPolicy, required: dict[str, bool], acked: set[str]) -> bool:
    """Whether ``acked`` sinks are enough to commit under ``policy``."""
    if policy.mode == "all":
        return all(s in acked for s in required)
    if policy.mode == "quorum":
        return len(acked) >= policy.quorum
    return all(s in acked for s, req in required.items() if req)


class DeliveryCoordinator(Actor):
    """Delivers each batch to all sinks concurrently, then commits checkpoints.

    Batches are handled one at a time in arrival order (FIFO): no reordering,
    ever, including across retries. A batch is retried — only towards the sinks
    that have not acknowledged it — with exponential backoff until the commit
    policy is satisfied; only then are the acknowledging sinks' checkpoints
    written. A sink that failed a batch the others committed is *lagging*: it
    gets nothing more in this run (so its checkpoint can never jump over the
    gap) and catches up from its own checkpoint at the next start.
    """

    def __init__(
        self,
        ctx: PipelineContext,
        workers: dict[str, ActorRef[DeliveryWorker]],
        committer: ActorRef[CheckpointCommitter],
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.workers = workers
        self.committer = committer
        self.policy = ctx.config.commit_policy
        self.required = {s.id: s.required for s in ctx.config.sinks}
        sup = ctx.config.supervision
        self.backoff = Backoff(sup.backoff_base_ms / 1000, sup.backoff_max_ms / 1000)
        self.lagging: set[str] = {s for s, st in ctx.stats.sinks.items() if st.lagging}
        self.rng = ctx.rng

    @classmethod
    def mailbox_for(cls, max_inflight: int) -> int:
        return max(1, max_inflight)

    async def receive(self, message: Any) -> Any:
        if isinstance(message, DeliverBatch):
            await self._deliver(message.batch)
            return None
        if isinstance(message, Barrier):
            return True
        return await super().receive(message)

    async def _deliver(self, batch: Batch) -> None:
        acked: dict[str, BatchDelivered] = {}
        failed: dict[str, str] = {}
        dead: dict[str, str] = {}  # failed in a way retrying cannot fix: not asked again
        attempt = 0
        while True:
            todo = [s for s in self.required if s not in acked and s not in self.lagging and s not in dead]
            results = await asyncio.gather(*(self._ask(s, batch) for s in todo))
            failed = {}
            for sink_id, result in zip(todo, results, strict=True):
                if isinstance(result, BatchDelivered):
                    acked[sink_id] = result
                else:
                    failed[sink_id] = result.reason
                    if not result.retryable and self._needed(sink_id):
                        raise DeliveryAbandoned(f"sink {sink_id!r}: {result.reason}")
                    if not result.retryable:
                        dead[sink_id] = result.reason
            if policy_satisfied(self.policy, self.required, set(acked)):
                break
            if self.policy.mode == "quorum":
                able = [s for s in self.required if s not in dead and s not in self.lagging]
                if len(able) < self.policy.quorum:
                    why = "; ".join(f"sink {s!r}: {r}" for s, r in dead.items())
                    raise DeliveryAbandoned(
                        f"quorum {self.policy.quorum} cannot be met: only {len(able)} sinks can still take "
                        f"batch {batch.id} ({why})"
                    )
            attempt += 1
            self.ctx.stats.commit_failures += 1
            delay = self.backoff.delay(min(attempt, 30), self.rng)
            self.log.warning(
                "commit_policy_unsatisfied",
                batch=batch.id,
                failed=failed,
                retry_in_s=round(delay, 3),
                attempt=attempt,
            )
            await self.ctx.clock.sleep(delay)
        for sink_id, reason in {**failed, **dead}.items():
            self.lagging.add(sink_id)
            self.ctx.stats.sinks[sink_id].lagging = True
            self.log.warning("sink_lagging", sink=sink_id, batch=batch.id, reason=reason)
        checkpoints = {self.ctx.key(s): r.checkpoint for s, r in acked.items()}
        if checkpoints:
            await self.committer.ask(CommitCheckpoint(batch.id, checkpoints))
        stats = self.ctx.stats
        stats.batches_committed += 1
        stats.events_committed += len(batch.events)
        stats.last_checkpoint = batch.checkpoint
        stats.last_commit_at = time.time()

    def _needed(self, sink_id: str) -> bool:
        if self.policy.mode == "all":
            return True
        if self.policy.mode == "quorum":
            return False
        return self.required[sink_id]

    async def _ask(self, sink_id: str, batch: Batch) -> BatchDelivered | DeliveryFailed:
        try:
            return await self.workers[sink_id].ask(DeliverTo(batch), timeout=ASK_TIMEOUT)
        except Fatal:
            raise
        except ActorStopped as exc:
            return DeliveryFailed(sink_id, batch.id, str(exc), True)
        except Exception as exc:  # noqa: BLE001 - the worker crashed; its supervisor restarts it
            return DeliveryFailed(sink_id, batch.id, f"{type(exc).__name__}: {exc}", True)
