"""Exactly-once sinks under SIGKILLs: Redis Streams (exactly_once watermarks) holds each change
once, a PostgreSQL if_newer target ends equal to the source, and Kafka exactly_once loses nothing
and keeps order, whatever the crash points. (Kafka's duplicates are not counted here: Tansu 0.6
hands aborted records to read_committed consumers; tests/test_kafka_sink.py proves the
exactly-once commit across a crash.) The Kafka sink sends the native envelope, so the PostgreSQL
decoder child makes each change's record (frames.py): after every crash, serve never finds one
other than its own."""

from __future__ import annotations

import random
import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig


def run(ctx: RunContext) -> None:
    rng = random.Random(ctx.seed + 1)
    with postgres_rig(ctx) as rig:
        rig.add_redis(exactly_once=True)
        rig.add_postgres_target()
        rig.add_kafka(exactly_once=True)
        rig.start(batch={"max_events": 25, "max_ms": 10})
        rig.workload.start(per_second=150)
        for _ in range(4):
            time.sleep(rng.uniform(0.5, 3.0))  # the crash point: random, by design
            rig.restart()
        rig.verify()
        said = (ctx.workdir / "log.jsonl").read_text()
        ctx.expect("child records other than serve's", said.count('"child_envelope_mismatch"'), 0)
