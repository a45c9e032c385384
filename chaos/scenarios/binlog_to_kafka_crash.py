"""MariaDB → Kafka, serve SIGKILLed at random moments (seeded) while rows are written. For a Kafka
sink with the native envelope the binlog decoder child makes each change's envelope from the
same opening as serve (txevents.py): after every restart, mid-transaction included, nothing is
lost, order is kept, and serve never finds a child's envelope other than its own."""

from __future__ import annotations

import random
import time

import orjson

from chaos.runner import RunContext
from chaos.scenarios.rig import mariadb_rig


def run(ctx: RunContext) -> None:
    rng = random.Random(ctx.seed)
    kills = 5 if ctx.duration is None else max(1, int(ctx.duration // 4))
    with mariadb_rig(ctx) as rig:
        rig.add_kafka()
        rig.start(batch={"max_events": rng.choice([7, 50, 300]), "max_ms": 20, "respect_source_tx": False})
        rig.workload.start(per_second=200)
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, 2.5))  # the crash point: random, by design
            rig.restart()
        ctx.figures["kills"] = kills
        rig.verify()
        log = (ctx.workdir / "log.jsonl").read_bytes().splitlines()
        events = [orjson.loads(line).get("event") for line in log if line.startswith(b"{")]
        ctx.expect("child envelopes other than serve's", events.count("child_envelope_mismatch"), 0)
