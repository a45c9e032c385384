"""A sink's checkpoint rolled back or forgotten by hand (``deltaforge checkpoints --rollback`` /
``--forget``) is delivered again from there, by exactly-once sinks too: they keep their own record
of what they hold (a Kafka sink's position record, a Redis stream's watermark), which the next
start would otherwise take over the checkpoint set back, and skip what the operator asked for."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.position import Position
from deltaforge.sinks.base import RetryableSinkError
from deltaforge.state.checkpoints import MemoryCheckpointStore, set_back_key, set_back_note, sink_key
from deltaforge.state.sqlite_store import SqliteCheckpointStore
from tests.helpers import wait_until
from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc, sink_pipeline
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu
from tests.test_kafka_sink import consume

N = 3000
SMALL = {"max_events": 500, "max_ms": 20}
"""Batches of 500 events: checkpoints to roll back to."""


def checkpoints(store: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "deltaforge", "checkpoints", "--storage-path", str(store), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


async def drain(doc: dict[str, Any], store_path: Path, total: int) -> None:
    """The pipeline of ``doc`` over a synthetic source of ``total`` events, from the checkpoints
    in ``store_path``, until every event is committed."""
    doc = {**doc, "spec": {**doc["spec"], "storage": {"type": "sqlite", "path": str(store_path)}}}
    source = SyntheticSource(total, chunk=500)
    runner = PipelineRunner(parse_pipeline(doc, env={}), source=source)
    task = asyncio.create_task(runner.run())

    def done() -> bool:  # all it read committed, from where it opened
        return bool(source.opened_from) and runner.ctx.stats.events_committed > total - source.opened_from[0]

    try:
        await wait_until(lambda: done() or task.done(), timeout=120, what="committed")
        await runner.drain()
        await task
    finally:
        runner.stop_now()
        await asyncio.gather(task, return_exceptions=True)
    assert runner.state == "stopped", runner.failure


async def set_back(doc: dict[str, Any], store_path: Path, sid: str, how: str) -> int:
    """``sid``'s checkpoint set back: rolled back to its last version behind the middle, or
    forgotten, with the CLI, or the pipeline deleted with its checkpoints (what ``DELETE
    /pipelines/{name}?checkpoints=delete`` runs); the sequence number it is set back to."""
    key = sink_key("src", sid)
    if how == "forget":
        checkpoints(store_path, "--forget", key)
        return 0
    if how == "delete":
        storage = {"type": "sqlite", "path": str(store_path)}
        await PipelineRunner(
            parse_pipeline({**doc, "spec": {**doc["spec"], "storage": storage}}, env={})
        ).forget_checkpoints()
        return 0
    store = SqliteCheckpointStore(store_path)
    await store.open()
    try:
        versions = await store.versions(key)
    finally:
        await store.close()
    back = next(v for v in reversed(versions) if int(v.value["seq"]) <= N // 2)
    checkpoints(store_path, "--rollback", key, "--to", str(back.version))
    return int(back.value["seq"])


@pytest.mark.parametrize("how", ["rollback", "forget", "delete"])
async def test_a_kafka_exactly_once_sink_set_back_by_hand_is_delivered_again_from_there(
    tansu: Tansu, tmp_path: Path, how: str
) -> None:
    topic = f"cdc.rw{how}"
    tansu.create_topic(topic)
    tansu.create_topic("deltaforge.offsets", partitions=1)
    doc = sink_pipeline(
        f"rw{how}",
        "kafka",
        {"id": "k", "brokers": tansu.bootstrap, "topic": topic, "exactly_once": True},
        SMALL,
    )
    store = tmp_path / "cp.db"
    await drain(doc, store, N)
    seq = await set_back(doc, store, "k", how)
    with capture_logs() as logs:
        await drain(doc, store, N)
    ids = [int(d["event_id"]) for _, _, d, _ in consume(tansu.bootstrap, topic, 2 * N - seq)]
    assert sorted(ids) == sorted([*range(1, N + 1), *range(seq + 1, N + 1)])  # again from there, once
    assert [e for e in logs if e["event"] == "sink_record_rewound"], "the rewind is said"


@pytest.mark.parametrize("how", ["rollback", "forget", "delete"])
async def test_a_redis_exactly_once_stream_set_back_by_hand_is_delivered_again_from_there(
    redis_server: Redis, tmp_path: Path, how: str
) -> None:
    stream = f"cdc.rw{how}"
    doc = sink_pipeline(
        f"rw{how}",
        "redis",
        {"id": "r", "uri": redis_server.uri(), "stream": stream, "exactly_once": True},
        SMALL,
    )
    store = tmp_path / "cp.db"
    await drain(doc, store, N)
    others = [f"{stream}:df:watermark:rw{how}:0badcafe", f"{stream}:df:watermark:rw{how}x"]
    for key in others:  # another deployment's, another pipeline's: theirs to keep
        redis_server.client().set(key, "keep")
    seq = await set_back(doc, store, "r", how)
    await drain(doc, store, N)
    got = [int(orjson.loads(f[b"event"])["event_id"]) for _, f in redis_server.client().xrange(stream)]
    assert got == [*range(1, N + 1), *range(seq + 1, N + 1)]
    assert [redis_server.client().get(key) for key in others] == [b"keep", b"keep"]


class Rewinding(ScriptedSink):
    """A sink whose first rewind fails as a server down a moment would."""

    def __init__(self) -> None:
        super().__init__("a")
        self.log: list[str] = []

    async def rewind(self, position: Position | None) -> None:
        self.log.append("rewind")
        if self.log.count("rewind") == 1:
            raise RetryableSinkError("down a moment")

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        self.log.append("deliver")
        await super().deliver(events, position)


async def test_a_rewind_that_fails_is_tried_again_before_anything_is_delivered() -> None:
    """The retry of the first batch after a failed rewind found the sink open and delivered
    without rewinding (an exactly-once sink then skipped what the operator asked for again)."""
    store = MemoryCheckpointStore()
    await store.put(set_back_key("src", "a"), set_back_note("rollback"))
    sink = Rewinding()
    runner = PipelineRunner(
        config(sinks=[sink_doc("a")]), store=store, source=SyntheticSource(10), sinks={"a": sink}
    )
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: len(sink.received) >= 10 or task.done(), timeout=60, what="delivered")
        await runner.drain()
    finally:
        runner.stop_now()
        await asyncio.gather(task, return_exceptions=True)
    assert sink.log[:3] == ["rewind", "rewind", "deliver"], sink.log
    assert await store.get(set_back_key("src", "a")) is None  # the note goes once the rewind is done


@pytest.mark.parametrize(
    "args", [(), ("--forget", "src::sink::a"), ("--rollback", "src::sink::a", "--to", "1")]
)
def test_a_store_that_is_not_there_is_said_not_made(tmp_path: Path, args: tuple[str, ...]) -> None:
    """A mistyped ``--storage-path`` made an empty store there (its folders too) and was told "no
    checkpoints", or "no checkpoint" to a --forget: as if the pipeline had none."""
    typo = tmp_path / "dta" / "deltaforge.db"
    done = subprocess.run(
        [sys.executable, "-m", "deltaforge", "checkpoints", "--storage-path", str(typo), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(f"no checkpoint store at {typo}: ")
    assert not (tmp_path / "dta").exists()
