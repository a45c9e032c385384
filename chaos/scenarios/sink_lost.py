"""Sink servers restarted without their data under writes: Redis (what its defaults do to
everything since the last RDB save; here SIGKILL, and its append-only file gone) and a Kafka
broker under ``exactly_once`` (this Tansu keeps records in memory). serve cannot send what they
lost (its checkpoint is past it), and says so: ``sink_lost_acknowledged``, once per sink, naming
the Redis stream and the Kafka sink's position record. The pipeline goes on, the file sink
complete, each of the two holding only what came after."""

from __future__ import annotations

import shutil
import signal

import orjson

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        kafka = rig.add_kafka(exactly_once=True)
        serve = rig.start()
        rig.workload.start()

        def delivered(sink: str) -> int:
            return int(serve.get("/pipelines/chaos").json()["counters"]["sinks"][sink]["events"])

        wait_for(lambda: delivered("redis") > 200 and delivered("kafka") > 200, 60, "200 changes in each")
        redis.server.kill(signal.SIGKILL)
        shutil.rmtree(redis.server.dir / "appendonlydir")
        redis.server.start()  # same port, nothing kept
        kafka.server.kill(signal.SIGKILL)
        kafka.server.start()
        kafka.server.create_topic("cdc", partitions=1)
        log = ctx.workdir / "log.jsonl"

        def said() -> list[dict[str, object]]:
            lines = log.read_bytes().splitlines() if log.exists() else []
            return [e for e in map(orjson.loads, lines) if e.get("event") == "sink_lost_acknowledged"]

        took = wait_for(lambda: len(said()) >= 2, 90, "sink_lost_acknowledged for both sinks in the log")
        ctx.figures["named_after_s"] = round(took, 1)
        # What they lost is gone: the rest of the pipeline is verified, and what they hold below.
        del rig.sinks["redis"], rig.sinks["kafka"]
        rig.verify()
        named = {str(e.get("sink")): e for e in said()}
        ctx.expect("losses named", len(said()), 2)
        if named.get("redis", {}).get("where") != "cdc" or "kafka" not in named:
            raise Failed(f"the losses are not named as Redis stream 'cdc' and sink 'kafka': {said()!r}")
        ctx.figures["Redis acknowledged"] = named["redis"]["acknowledged"]
        committed = len(rig.workload.committed)
        for name, sink in (("Redis", redis), ("Kafka", kafka)):
            held = len(sink.read())
            ctx.figures[f"{name} holds"] = held
            if not 0 < held < committed:
                raise Failed(f"{name} should hold the changes after its restart only: {held} of {committed}")
        ctx.figures["committed"] = committed
