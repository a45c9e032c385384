"""The dead-letter queue: poison events kept with why, bounded, and replayable.

A delivery worker that finds a poison event (``sinks.base.PoisonEvent``: a
template that does not resolve, a record too large, a row the target refuses)
puts it here when ``spec.journal.enabled``; the rest of the batch is delivered
in order and the checkpoint moves on. An entry keeps the pipeline, sink, event
id and idempotency key, the event's source position, the error kind and message,
the attempts, and the event itself: as JSON for people (truncated past
``max_event_bytes``) and, when not truncated, exactly (pickled) for replay, which
re-delivers it with its original idempotency key.

Bounds: entries older than ``max_age_secs`` are dropped when a new one comes; at
``max_entries`` the overflow policy decides: ``drop_oldest`` makes room,
``reject`` drops the new entry (counted and logged with its coordinates), and
``block`` holds the sink — ``/health`` degraded — until an operator acks or
purges.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pickle
import time
from typing import Any

import orjson
import structlog

from deltaforge.envelopes import encode, shape
from deltaforge.events import Event
from deltaforge.pipeline.availability import Availability
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.sections import JournalConfig
from deltaforge.sinks.base import PoisonEvent
from deltaforge.state.deadletters import DeadLetterStore, Entry, Select

_native = shape("native")
BLOCK_RECHECK_S = 5.0  # a blocked sink also looks again this often: entries may have aged out


class DeadLetterQueue:
    """One pipeline's DLQ over its store's ``dead_letters``; see the module."""

    def __init__(
        self,
        pipeline: str,
        config: JournalConfig,
        store: DeadLetterStore,
        availability: Availability,
        patient: PatientWrites,
    ) -> None:
        self.pipeline = pipeline
        self.enabled = config.enabled
        self.max_event_bytes = config.max_event_bytes
        self.bounds = config.dlq
        self.store = store
        self.availability = availability
        self.patient = patient
        self.added = self.rejected = self.dropped = self.replayed = 0
        self.entries = 0  # as last counted: what the metrics show
        self._space = asyncio.Event()
        self._putting = asyncio.Lock()
        self.log = structlog.get_logger().bind(pipeline=pipeline, actor="DeadLetterQueue")

    async def put(self, sink: str, event: Event, error: PoisonEvent, attempts: int) -> int | None:
        """Keep ``event``: its seq, or None when the ``reject`` policy dropped it. On a full disk,
        tried again until it holds (see storewait): its only write that counts is the last."""
        entry = self._entry(sink, event, error, attempts)
        return await self.patient(lambda: self._put_alone(sink, event, error, entry))

    async def _put_alone(self, sink: str, event: Event, error: PoisonEvent, entry: Entry) -> int | None:
        # One put at a time: the bound is counted and the entry added as one step. Side by side,
        # every sink's worker saw room and added (6 entries kept under max_entries 2).
        async with self._putting:
            return await self._put(sink, event, error, entry)

    async def _put(self, sink: str, event: Event, error: PoisonEvent, entry: Entry) -> int | None:
        await self._expire()
        while (count := await self.store.count(self.pipeline)) >= self.bounds.max_entries:
            policy = self.bounds.overflow_policy
            if policy == "drop_oldest":
                oldest = await self.store.select(
                    self.pipeline, Select(limit=count - self.bounds.max_entries + 1)
                )
                self.dropped += await self.store.delete(self.pipeline, [e["seq"] for e in oldest])
                continue
            if policy == "reject":
                self.rejected += 1
                self.log.error("dlq_rejected", sink=sink, event_id=event.event_id,
                               position=entry["position"], reason=entry["error"])  # fmt: skip
                return None
            await self._wait_for_space(sink, count)
        seq = await self.store.add(entry)  # the last step that can fail: a retry never adds twice
        self.added += 1
        self.entries = count + 1
        self.log.warning("dlq_added", seq=seq, sink=sink, kind=error.kind, event_id=event.event_id,
                         position=entry["position"], reason=entry["error"])  # fmt: skip
        return seq

    async def _wait_for_space(self, sink: str, count: int) -> None:
        what = f"dlq:{sink}"
        self.availability.down(what, RuntimeError(f"dead-letter queue full ({count} entries): ack or purge"))
        self._space.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._space.wait(), BLOCK_RECHECK_S)
        await self._expire()
        if await self.store.count(self.pipeline) < self.bounds.max_entries:
            self.availability.up(what)

    async def _expire(self) -> None:
        old = await self.store.select(
            self.pipeline, Select(older_than=time.time() - self.bounds.max_age_secs)
        )
        if old:
            self.dropped += await self.store.delete(self.pipeline, [e["seq"] for e in old])

    def _entry(self, sink: str, event: Event, error: PoisonEvent, attempts: int) -> Entry:
        shown = encode(_native(event))
        truncated = len(shown) > self.max_event_bytes
        s = event.source
        return {
            "pipeline": self.pipeline,
            "sink": sink,
            "kind": error.kind,
            "error": str(error),
            "attempts": attempts,
            "at": time.time(),
            "event_id": event.event_id,
            "idempotency_key": event.idempotency_key,
            "table": f"{s.db}.{s.table}",
            "position": s.position.to_doc(),
            "truncated": truncated,
            "event": shown[: self.max_event_bytes].decode(errors="replace")
            if truncated
            else orjson.loads(shown),
            "payload": None if truncated else base64.b64encode(pickle.dumps(event)).decode(),
        }

    # -- what operators do (REST) --------------------------------------------------------
    async def show(self, which: Select) -> list[Entry]:
        return [
            {k: v for k, v in e.items() if k != "payload"}
            for e in await self.store.select(self.pipeline, which)
        ]

    async def count(self, sink: str | None = None) -> int:
        return await self.store.count(self.pipeline, sink)

    async def remove(self, which: Select) -> int:
        """Ack (up to a seq) or purge: the entries are gone, a blocked sink may go on."""
        gone = await self.store.delete(
            self.pipeline, [e["seq"] for e in await self.store.select(self.pipeline, which)]
        )
        self.entries = await self.store.count(self.pipeline)
        self._space.set()
        return gone

    async def take_for_replay(self, which: Select) -> dict[str, list[tuple[int, Event]]]:
        """The chosen entries' events by sink, oldest first; a truncated one cannot be replayed."""
        by_sink: dict[str, list[tuple[int, Event]]] = {}
        for e in await self.store.select(self.pipeline, which):
            if e.get("payload") is None:
                raise ValueError(
                    f"entry {e['seq']} was truncated (over max_event_bytes): it cannot be replayed"
                )
            event: Any = pickle.loads(base64.b64decode(e["payload"]))
            by_sink.setdefault(str(e["sink"]), []).append((int(e["seq"]), event))
        return by_sink
