"""Every sink server unreachable at once for 20 s (Kafka, NATS JetStream, Redis exactly_once
and a PostgreSQL if_newer target, each behind a disabled proxy) while rows are written:
degraded meanwhile, recovered by itself, each sink ends with every change in order (Redis and
NATS once each, the target equal to the source). librdkafka's complaint at every reconnect
(3 to 5 a second, 188 lines in the outage before) is logged once a minute."""

from __future__ import annotations

import time

from chaos.harness import library_lines
from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        sinks = [rig.add_kafka(), rig.add_nats(), rig.add_redis(exactly_once=True), rig.add_postgres_target()]
        rig.start()
        rig.workload.start()
        rig.progress(0)
        for sink in sinks:
            assert sink.proxy is not None
            sink.proxy.disable()
        wait_for(rig.degraded, 60, "/health degraded")
        time.sleep(20)  # the outage itself
        for sink in sinks:
            assert sink.proxy is not None
            sink.proxy.enable()
        rig.verify()
        said, repeated = library_lines(ctx.workdir / "log.jsonl")  # one serve process throughout
        ctx.figures["library lines"] = said
        ctx.expect("library lines repeated within a minute", repeated, 0)
