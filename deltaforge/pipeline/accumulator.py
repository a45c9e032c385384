"""Accumulator: cuts the event stream into batches."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from actors import Actor, ActorRef
from deltaforge.events import Event
from deltaforge.metrics import StageTimers
from deltaforge.pipeline.batching import cut_point
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import Batch, DeliverBatch, EventsRead, FlushDue, FlushNow

if TYPE_CHECKING:
    from deltaforge.pipeline.coordinator import DeliveryCoordinator
    from deltaforge.pipeline.transformer import SparkTransformer


class Accumulator(Actor):
    """Buffers chunks and cuts batches by ``max_events``, ``max_bytes`` and ``max_ms``.

    Batching is adaptive: when the reader says the source is caught up (nothing more ready)
    and no more chunks wait here, what is buffered goes on at once; a batch grows towards the
    limits only while a backlog is being read, or while ``batches`` is busy with the batch
    before it (it could not start this one sooner: it gets it the moment it is free, as one
    batch rather than several small ones queued). ``max_ms`` bounds how long it may wait.

    With ``respect_source_tx`` a cut happens only at a transaction end, so a
    transaction larger than the limits makes a larger batch, up to ``max_tx_events``:
    one larger than that is split (logged once, ``transaction_split``). Batches go to
    ``batches`` (the SparkTransformer when there are processors, else the
    coordinator), whose mailbox holds ``max_inflight`` of them: when it is full
    this actor waits, its own mailbox fills, and the reader waits in turn.
    """

    mailbox_size = 4

    def __init__(
        self, ctx: PipelineContext, batches: ActorRef[DeliveryCoordinator] | ActorRef[SparkTransformer]
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.batches = batches
        self.cfg = ctx.config.batch
        self.buffer: list[Event] = []
        self.first_at: float | None = None
        self.next_id = 0
        self.epoch = 0
        self.caught_up = False  # what the last chunk said of the source
        self.split = ""  # the last transaction split across batches (logged once)
        self.timers = StageTimers(ctx.config.name)
        self._ticker: asyncio.Task[None] | None = None
        self._waker: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        period = max(self.cfg.max_ms / 2000, 0.005)
        while True:
            await asyncio.sleep(period)
            if self.buffer:
                with contextlib.suppress(Exception):
                    self.ref.try_tell(FlushDue())

    async def receive(self, message: Any) -> Any:
        if isinstance(message, EventsRead):
            if message.epoch != self.epoch:
                # The source was opened again from the durable checkpoints: what is buffered
                # will be read again, and keeping it would put those events twice, out of order.
                self.epoch = message.epoch
                self.buffer = []
            if not self.buffer and message.events:
                self.first_at = time.monotonic()
            self.buffer.extend(message.events)
            # Adaptive batching: a batch grows only while more is waiting, in the source or in
            # this mailbox, or while the sinks are busy with the batch before it; once the source
            # is caught up and they are free it goes on without waiting for max_ms.
            self.caught_up = message.caught_up
            more = self.ref.mailbox_depth > 0 or self.ref.waiting_senders > 0
            await self._cut(final=self.caught_up and not more and self._downstream_free())
        elif isinstance(message, FlushDue):
            if self.first_at is None:
                return None
            if (time.monotonic() - self.first_at) * 1000 >= self.cfg.max_ms or (
                self.caught_up and self._downstream_free()
            ):
                await self._cut(final=True)
        elif isinstance(message, FlushNow):
            await self._cut(final=True)
            return True
        else:
            return await super().receive(message)
        return None

    def _downstream_free(self) -> bool:
        """Whether ``batches`` is free to take a batch now; if not, a wake-up is arranged for when
        it is. Measured on PostgreSQL -> Kafka ``exactly_once`` drains, where the sink is the
        slower side: fewer, larger transactions (docs/performance.md)."""
        if not self.batches.busy:
            return True
        if self._waker is None or self._waker.done():
            self._waker = asyncio.create_task(self._wake_when_free())
        return False

    async def _wake_when_free(self) -> None:
        await self.batches.wait_idle()
        with contextlib.suppress(Exception):
            self.ref.try_tell(FlushDue())  # full: the chunks queued here decide as they come

    async def _cut(self, final: bool) -> None:
        cfg = self.cfg
        while self.buffer:
            n = cut_point(self.buffer, cfg.max_events, cfg.max_bytes, cfg.respect_source_tx, final=final,
                          max_tx_events=cfg.max_tx_events, split=self.split)  # fmt: skip
            if n == 0:
                return
            events, self.buffer = self.buffer[:n], self.buffer[n:]
            if cfg.respect_source_tx and not events[-1].tx_end and events[-1].tx_id != self.split:
                self.split = events[-1].tx_id
                self.log.warning(
                    "transaction_split", tx=self.split, events_so_far=n, max_tx_events=cfg.max_tx_events,
                    reason="a source transaction this large is delivered in several batches, not held whole",
                )  # fmt: skip
            now = time.monotonic()
            if self.first_at is not None:
                self.timers.batch.observe(now - self.first_at)
            self.first_at = now if self.buffer else None
            self.next_id += 1
            batch = Batch(self.next_id, events, sum(e.size for e in events), epoch=self.epoch)
            self.timers.batch_events.observe(len(events))
            self.timers.batch_bytes.observe(batch.size_bytes)
            await self.batches.tell(DeliverBatch(batch))

    async def on_stop(self) -> None:
        for task in (self._ticker, self._waker):
            if task is not None:
                task.cancel()
