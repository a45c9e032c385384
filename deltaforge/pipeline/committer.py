"""CheckpointCommitter: the only writer of checkpoints."""

from __future__ import annotations

import time
from typing import Any

from actors import Actor
from deltaforge.metrics import StageTimers
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import CommitCheckpoint
from deltaforge.pipeline.storewait import PatientWrites


class CheckpointCommitter(Actor):
    """Writes a batch's per-sink checkpoints in one atomic store write.

    It is asked only after the commit policy is satisfied, so a checkpoint
    never names a position a sink has not acknowledged. The reply comes after
    the write is durable. The coordinator delivers the next batch meanwhile but
    sends one write at a time, so checkpoints are written in batch order.
    """

    mailbox_size = 4

    def __init__(self, ctx: PipelineContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.timer = StageTimers(ctx.config.name).checkpoint
        self.patient = PatientWrites(ctx)

    async def receive(self, message: Any) -> Any:
        if not isinstance(message, CommitCheckpoint):
            return await super().receive(message)
        started = time.perf_counter()
        # Tried until the store takes it (a full disk: degraded meanwhile, see storewait).
        docs = {key: p.to_doc() for key, p in message.checkpoints.items()}
        await self.patient(lambda: self.ctx.store.put_many(docs))
        self.timer.observe(time.perf_counter() - started)
        by_key = {self.ctx.key(sid): sid for sid in self.ctx.sinks}
        now = time.time()
        for key, checkpoint in message.checkpoints.items():
            self.ctx.durable[by_key[key]] = checkpoint
            self.ctx.stats.sinks[by_key[key]].checkpoint_at = now
        self.ctx.stats.last_commit_at = now
        return message.batch_id
