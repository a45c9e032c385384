"""Sink servers restarted without their data under writes: Redis (what its defaults do to
everything since the last RDB save; here SIGKILL, and its append-only file gone) and two Kafka
brokers, one under an ``exactly_once`` sink, one under a default one (this Tansu keeps records in
memory). serve cannot send what they lost (its checkpoint is past it), and says so:
``sink_lost_acknowledged``, once per sink, naming the Redis stream, the ``exactly_once`` sink's
position record and the other's partition. The pipeline goes on, the file sink complete, each of
the three holding only what came after."""

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
        plain = rig.add_kafka(name="kafka_default")
        lost = {"redis": redis, "kafka": kafka, "kafka_default": plain}
        serve = rig.start()
        rig.workload.start()

        def delivered(sink: str) -> int:
            return int(serve.get("/pipelines/chaos").json()["counters"]["sinks"][sink]["events"])

        wait_for(lambda: all(delivered(name) > 200 for name in lost), 60, "200 changes in each")
        redis.server.kill(signal.SIGKILL)
        shutil.rmtree(redis.server.dir / "appendonlydir")
        redis.server.start()  # same port, nothing kept
        for broker in (kafka.server, plain.server):
            broker.kill(signal.SIGKILL)
            broker.start()
            broker.create_topic("cdc", partitions=1)
        log = ctx.workdir / "log.jsonl"

        def said() -> list[dict[str, object]]:
            lines = log.read_bytes().splitlines() if log.exists() else []
            return [e for e in map(orjson.loads, lines) if e.get("event") == "sink_lost_acknowledged"]

        took = wait_for(lambda: len(said()) >= 3, 90, "sink_lost_acknowledged for the three sinks in the log")
        ctx.figures["named_after_s"] = round(took, 1)
        # A Kafka sink whose broker came back without its data fails one attempt on a producer
        # the broker no longer knows before a new one delivers: wait for each sink to deliver
        # again, and say how long that took.
        at = {name: delivered(name) for name in lost}
        again = wait_for(
            lambda: all(delivered(n) > at[n] + 100 for n in lost), 120, "each sink delivering again"
        )
        ctx.figures["delivering_again_after_s"] = round(took + again, 1)
        # What they lost is gone: the rest of the pipeline is verified, and what they hold below.
        for name in lost:
            del rig.sinks[name]
        rig.verify()
        named = {str(e.get("sink")): str(e.get("where")) for e in said()}
        ctx.expect("losses named", len(said()), 3)
        wanted = {"redis": "cdc", "kafka": "the sink's position record", "kafka_default": "cdc[0]"}
        if named != wanted:
            raise Failed(f"the losses are not named {wanted!r}: {said()!r}")
        committed = len(rig.workload.committed)
        for name, sink in lost.items():
            held = len(sink.read())
            ctx.figures[f"{name} holds"] = held
            if not 0 < held < committed:
                raise Failed(f"{name} should hold the changes after its restart only: {held} of {committed}")
        ctx.figures["committed"] = committed
