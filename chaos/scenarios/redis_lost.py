"""Redis restarted without its data under writes (what its defaults do to everything since the
last RDB save: here SIGKILL, and its append-only file gone). serve cannot send the lost entries
again (its checkpoint is past them), and says so: ``sink_lost_acknowledged`` naming the stream,
logged once; the pipeline goes on, the file sink complete, Redis holding what came after."""

from __future__ import annotations

import shutil
import signal

import orjson

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        rig.start()
        rig.workload.start()
        wait_for(lambda: len(redis.read()) > 200, 60, "Redis holds more than 200 changes")
        server = redis.server
        server.kill(signal.SIGKILL)
        shutil.rmtree(server.dir / "appendonlydir")
        server.start()  # same port, nothing kept
        log = ctx.workdir / "log.jsonl"

        def said() -> list[dict[str, object]]:
            lines = log.read_bytes().splitlines() if log.exists() else []
            return [e for e in map(orjson.loads, lines) if e.get("event") == "sink_lost_acknowledged"]

        took = wait_for(lambda: bool(said()), 60, "sink_lost_acknowledged in the log")
        ctx.figures["named_after_s"] = round(took, 1)
        del rig.sinks["redis"]  # what it lost is gone: the rest of the pipeline is verified
        rig.verify()
        events = said()
        ctx.expect("losses named", len(events), 1)
        first = events[0]
        if (first.get("sink"), first.get("where"), first.get("level")) != ("redis", "cdc", "error"):
            raise Failed(f"the loss is not named as Redis stream 'cdc': {first!r}")
        ctx.figures["acknowledged"], ctx.figures["now_ends_at"] = first["acknowledged"], first["now_ends_at"]
        after = len(redis.read())
        ctx.figures["Redis holds"], ctx.figures["committed"] = after, len(rig.workload.committed)
        if not 0 < after < len(rig.workload.committed):
            raise Failed(f"Redis should hold the changes after its restart only: {after}")
