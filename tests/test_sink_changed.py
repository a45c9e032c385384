"""A sink id whose sink changed type or destination while its checkpoint stayed: refused (type)
or said (destination), never a new destination silently missing everything before the
checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.pipeline.sinkids import destination
from tests.helpers import wait_until
from tests.kit import doc
from tests.test_turso_source import written


def runner(tmp: Path, sink: dict[str, Any]) -> PipelineRunner:
    d = doc(name="orders", storage={"type": "sqlite", "path": str(tmp / "cp.db")}, source_path=str(tmp / "src.db"),
            sinks=[sink])  # fmt: skip
    return PipelineRunner(parse_pipeline(d, env={}))


async def run_until_committed(r: PipelineRunner) -> None:
    task = asyncio.create_task(r.run())
    await wait_until(lambda: r.state == "failed" or r.ctx.stats.events_committed >= 1, what="a commit")
    assert r.state == "running", r.failure
    await r.drain()
    await asyncio.wait_for(task, 30)


async def start_and_stop(r: PipelineRunner) -> None:
    task = asyncio.create_task(r.run())
    await wait_until(lambda: r.state in ("running", "failed"), timeout=30, what="the pipeline started")
    r.stop_now()
    await asyncio.wait_for(task, 30)


def file_sink(path: Path) -> dict[str, Any]:
    return {"type": "file", "config": {"id": "out", "path": str(path)}}


async def test_a_sink_given_another_type_under_its_checkpoint_is_refused_naming_both(tmp_path: Path) -> None:
    """A file sink made a stdout sink under the same id would start from the file's checkpoint:
    everything before it missing from standard output. Refused at start, naming both sinks and
    the command that forgets the checkpoint; nothing stored, so the file sink back starts."""
    written(
        tmp_path / "src.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)", "INSERT INTO t VALUES (1)"
    ).close()
    await run_until_committed(runner(tmp_path, file_sink(tmp_path / "out.jsonl")))
    changed = runner(tmp_path, {"type": "stdout", "config": {"id": "out"}})
    await start_and_stop(changed)
    assert changed.state == "failed"
    assert changed.failure is not None and changed.failure.startswith(
        "spec.sinks[0]: sink 'out' holds the checkpoint of a file sink"
    ), changed.failure
    assert str(tmp_path / "out.jsonl") in changed.failure and "now a stdout sink" in changed.failure
    assert f"--storage-path {tmp_path / 'cp.db'} --forget src::sink::out" in changed.failure
    back = runner(tmp_path, file_sink(tmp_path / "out.jsonl"))
    await start_and_stop(back)
    assert back.state == "stopped" and back.failure is None


async def test_a_sink_given_another_destination_under_its_checkpoint_is_said_once(tmp_path: Path) -> None:
    """Another file (a topic, a server) under the same id may be a move (the data copied along),
    so it is not refused; but it is said, with both destinations and the command that forgets
    the checkpoint, once: the next start does not say it again."""
    written(
        tmp_path / "src.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)", "INSERT INTO t VALUES (1)"
    ).close()
    await run_until_committed(runner(tmp_path, file_sink(tmp_path / "out.jsonl")))
    seen = []
    for _ in range(2):
        moved = runner(tmp_path, file_sink(tmp_path / "moved.jsonl"))
        with capture_logs() as logs:
            await start_and_stop(moved)
        assert moved.state == "stopped" and moved.failure is None
        seen.append([e for e in logs if e["event"] == "sink_destination_changed"])
    [first], again = seen
    assert not again  # the new destination is the one stored now
    assert first["sink"] == "out" and first["log_level"] == "warning"
    assert (
        first["was"] == f"file {tmp_path / 'out.jsonl'}"
        and first["now"] == f"file {tmp_path / 'moved.jsonl'}"
    )
    assert "--forget src::sink::out" in first["reason"]


def test_a_destination_is_kept_without_credentials() -> None:
    """What the store keeps of each sink names its server, never a user, password or token (a
    password changed is no new destination either)."""
    sinks = [
        {"type": "redis", "config": {"id": "r", "uri": "redis://app:s3cret@cache:6379/2", "stream": "s"}},
        {
            "type": "postgres",
            "config": {"id": "p", "dsn": "postgresql://app:s3cret@db:5432/shop?password=s3cret"},
        },
        {
            "type": "nats",
            "config": {
                "id": "n",
                "url": "nats://s3cret@bus:4222,nats://u:s3cret@bus2:4222",
                "subject": "cdc.x",
            },
        },
        {
            "type": "kafka",
            "config": {"id": "k", "brokers": "b1:9092,b2:9092", "topic": "cdc.${source.table}"},
        },
        {"type": "stdout", "config": {"id": "o"}},
    ]
    cfg = parse_pipeline(doc(sinks=sinks), env={})
    described = {s.id: destination(s) for s in cfg.sinks}
    assert described == {
        "r": "redis redis://cache:6379/2 s",
        "p": "postgres postgresql://db:5432/shop ${source.table}",
        "n": "nats nats://bus:4222,nats://bus2:4222 cdc.x",
        "k": "kafka b1:9092,b2:9092 cdc.${source.table}",
        "o": "stdout",
    }
