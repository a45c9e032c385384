"""Building blocks for pipeline tests: config documents, a synthetic source, scripted sinks.

The fakes here exercise pipeline *logic* in-process; the real Turso source and
file sink are exercised by the end-to-end tests (test_serve_e2e.py, test_crash.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

from structlog.testing import capture_logs

from deltaforge.config import PipelineConfig, parse_pipeline
from deltaforge.configmodel import SinkConfig
from deltaforge.events import Event, SourceInfo
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.position import Position, PositionDoc, as_int
from deltaforge.sinks.base import RetryableSinkError, Sink
from deltaforge.sinks.stdout import StdoutSinkConfig
from deltaforge.sources.base import Source, own_position
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until


class SeqPosition(NamedTuple):
    """The synthetic source's position: a sequence number."""

    seq: int

    @property
    def order(self) -> tuple[int, ...]:
        return (self.seq,)

    def to_doc(self) -> PositionDoc:
        return {"seq": self.seq}

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> SeqPosition:
        return cls(as_int(doc, "seq"))


def doc(
    sinks: list[dict[str, Any]] | None = None,
    name: str = "t",
    batch: dict[str, Any] | None = None,
    commit_policy: dict[str, Any] | None = None,
    supervision: dict[str, Any] | None = None,
    source_path: str = "unused.db",
    storage: dict[str, Any] | None = None,
    journal: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"type": "turso", "config": {"id": "src", "path": source_path}},
        "sinks": sinks or [{"type": "stdout", "config": {"id": "a"}}],
        "storage": storage or {"type": "memory"},
    }
    if batch:
        spec["batch"] = batch
    if commit_policy:
        spec["commit_policy"] = commit_policy
    if journal:
        spec["journal"] = journal
    spec["supervision"] = supervision or {
        "max_restarts": 50,
        "within_seconds": 60,
        "backoff": {"base_ms": 1, "max_ms": 20},
    }
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": name, "tenant": "acme"},
        "spec": spec,
    }


def config(**kw: Any) -> PipelineConfig:
    return parse_pipeline(doc(**kw), env={})


def sink_doc(sid: str, required: bool = True) -> dict[str, Any]:
    return {"type": "stdout", "config": {"id": sid, "required": required}}


class SyntheticSource(Source):
    """Emits ``total`` events in transactions of ``tx_sizes`` (cycled), resuming by seq."""

    connector = "synthetic"

    def __init__(
        self, total: int, tx_sizes: list[int] | None = None, chunk: int = 1000, payload: int = 0
    ) -> None:
        self.id = "src"
        self.total = total
        self.tx_sizes = tx_sizes or [1]
        self.chunk = chunk
        self.payload = "x" * payload
        self.next = 1
        self.opened_from: list[int] = []
        self.reads = 0

    @staticmethod
    def load_position(doc: PositionDoc) -> SeqPosition:
        return SeqPosition.from_doc(doc)

    @property
    def idle_wait(self) -> float:
        return 0.01

    async def open(self, resume_after: Position | None) -> None:
        resume = own_position(resume_after, SeqPosition)
        self.next = resume.seq + 1 if resume else 1
        self.opened_from.append(self.next)

    def _tx_of(self, seq: int) -> tuple[int, bool]:
        """Transaction id and whether ``seq`` ends it (deterministic from seq)."""
        cycle = sum(self.tx_sizes)
        full, offset = divmod(seq - 1, cycle)
        tx = full * len(self.tx_sizes)
        for size in self.tx_sizes:
            if offset < size:
                return tx, offset == size - 1 or seq == self.total
            offset -= size
            tx += 1
        raise AssertionError("unreachable")

    def caught_up(self) -> bool:
        return self.next > self.total  # the whole backlog is ready from the start

    async def read(self) -> list[Event]:
        self.reads += 1
        if self.next > self.total:
            return []
        end = min(self.total, self.next + self.chunk - 1)
        # extend to the end of the transaction in progress, as a real source does
        while not self._tx_of(end)[1]:
            end += 1
        out = [make_event(s, *self._tx_of(s), payload=self.payload) for s in range(self.next, end + 1)]
        self.next = end + 1
        return out


def make_event(seq: int, tx: int = 0, tx_end: bool = True, payload: str = "", size: int = 100) -> Event:
    pos = SeqPosition(seq)
    return Event(
        op="c",
        before=None,
        after={"id": seq % 97, "seq": seq, "p": payload} if payload else {"id": seq % 97, "seq": seq},
        source=SourceInfo("synthetic", "db", "t", pos, 1_700_000_000_000),
        tx_id=str(tx),
        tx_end=tx_end,
        event_id=str(seq),
        order=(seq,),
        checkpoint=pos,
        tenant="acme",
        size=size,
    )


class ScriptedSink(Sink[StdoutSinkConfig]):
    """Records what it receives; ``script(batch_no, events)`` may raise or delay."""

    def __init__(
        self, sid: str, required: bool = True, script: Callable[[int, list[Event]], Any] | None = None
    ):
        super().__init__(SinkConfig("stdout", StdoutSinkConfig(id=sid, required=required)))
        self.script = script
        self.received: list[int] = []
        self.calls = 0

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        self.calls += 1
        if self.script is not None:
            result = self.script(self.calls, events)
            if asyncio.iscoroutine(result):
                await result
        self.received.extend(e.order[0] for e in events)


def sink_pipeline(
    name: str, sink_type: str, config: dict[str, Any], batch: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A pipeline document for sink tests: a placeholder source (tests pass a SyntheticSource),
    one sink, fast supervision backoff."""
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": name, "tenant": "acme"},
        "spec": {
            "source": {"type": "turso", "config": {"id": "src", "path": "unused.db"}},
            "sinks": [{"type": sink_type, "config": config}],
            "batch": batch or {"max_events": 2000, "max_ms": 20},
            "supervision": {
                "max_restarts": 50,
                "within_seconds": 60,
                "backoff": {"base_ms": 10, "max_ms": 200},
            },
        },
    }


class PacedSource(SyntheticSource):
    """A SyntheticSource that waits ``delay`` seconds before each read (a steady stream, not a burst)."""

    def __init__(self, total: int, chunk: int, delay: float = 0.005) -> None:
        super().__init__(total, chunk=chunk)
        self.delay = delay

    def caught_up(self) -> bool:
        return True  # the next events come after ``delay``

    async def read(self) -> list[Event]:
        await asyncio.sleep(self.delay)
        return await super().read()


class NeverDurable(MemoryCheckpointStore):
    """A store whose writes of the checkpoint stored under ``key`` never finish: nothing
    delivered to that sink is ever checkpointed (a restart finds no checkpoint)."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    async def put_many(self, values: dict[str, PositionDoc]) -> None:
        if self.key in values:
            await asyncio.Event().wait()
        await super().put_many(values)


class NextRuns:
    """Runs of one pipeline, each from where the one before left its checkpoints (one store), over
    a source that grows by the changes each run is to deliver."""

    def __init__(self) -> None:
        self.store = MemoryCheckpointStore()
        self.total = 0

    async def losses_named(self, doc: dict[str, Any], more: int) -> list[dict[str, Any]]:
        """Run ``doc`` until ``more`` changes are committed, drain and stop it; the
        ``sink_lost_acknowledged`` entries it logged."""
        self.total += more
        runner = PipelineRunner(
            parse_pipeline(doc, env={}), store=self.store, source=SyntheticSource(self.total, chunk=50)
        )
        with capture_logs() as logs:
            task = asyncio.create_task(runner.run())
            await wait_until(lambda: runner.ctx.stats.events_committed >= more, what="delivered")
            await runner.drain()
            await task
        return [e for e in logs if e["event"] == "sink_lost_acknowledged"]


async def losses_named(sink: Sink[Any], first: int, n: int = 5) -> list[dict[str, Any]]:
    """Deliver events ``first``.. (``n``) as a delivery worker does, once more on a new connection
    when the first attempt finds the old one closed (the server restarted); the
    ``sink_lost_acknowledged`` entries logged meanwhile."""
    batch = [make_event(i) for i in range(first, first + n)]
    with capture_logs() as logs:
        try:
            await sink.deliver(batch)
        except RetryableSinkError:
            await sink.close()
            await sink.deliver(batch)
    return [e for e in logs if e["event"] == "sink_lost_acknowledged"]
