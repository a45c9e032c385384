"""SourceReader: reads chunks from the source, from the minimum sink checkpoint."""

from __future__ import annotations

from typing import Any

import anyio

from actors import Actor
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.messages import EventsRead, ReadNext, StopReading


class SourceReader(Actor):
    """Pulls chunks from the :class:`Source` and tells them to the Accumulator.

    It resumes from the *minimum* checkpoint across sinks, so a sink that is
    behind gets what it is missing (sinks ahead of it skip what they have). A
    sink with no checkpoint yet means: from the beginning. The tell into the
    Accumulator waits while its mailbox is full — that is where a slow sink
    finally slows the database reads.
    """

    mailbox_size = 2

    def __init__(self, ctx: PipelineContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.reading = True

    async def on_start(self) -> None:
        ctx = self.ctx
        keys = [ctx.key(sid) for sid in ctx.sinks]
        found = await ctx.store.get_many(keys)
        resume: dict[str, Any] | None = None
        ctx.durable.clear()
        ctx.durable.update({sid: found[ctx.key(sid)] for sid in ctx.sinks if ctx.key(sid) in found})
        self.confirmed: dict[str, Any] | None = None
        if len(found) == len(keys):
            resume = min(found.values(), key=ctx.source.order_of)
        for gate in ctx.ready.values():
            await gate.wait()  # nothing is read before every processor has been checked
        self.log.info("source_opening", source=ctx.source.id, resume_after=resume)
        await ctx.source.open(resume)
        await self.ref.tell(ReadNext())

    async def receive(self, message: Any) -> Any:
        if isinstance(message, ReadNext):
            if not self.reading:
                return None
            source = self.ctx.source
            durable = self.ctx.durable_min()
            if durable is not None and durable is not self.confirmed:
                await source.confirm(durable)
                self.confirmed = durable
            events = await source.read()
            for table, columns, position in source.take_schema_changes():
                await self.ctx.store.record_schema(source.id, table, columns, position)
                self.log.info(
                    "schema_recorded", table=table, columns=[c["name"] for c in columns], position=position
                )
            if events:
                self.ctx.stats.events_read += len(events)
                await self.ctx.ref("accumulator").tell(EventsRead(events))
            else:
                await anyio.sleep(self.ctx.source.idle_wait)
            if self.reading:
                await self.ref.tell(ReadNext())
            return None
        if isinstance(message, StopReading):
            self.reading = False
            return True
        return await super().receive(message)

    async def on_stop(self) -> None:
        await self.ctx.source.close()
