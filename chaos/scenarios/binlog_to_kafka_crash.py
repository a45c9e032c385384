"""MariaDB → Kafka, serve SIGKILLed at random moments (seeded) while rows are written. For a Kafka
sink with the native envelope the binlog decoder child makes each change's envelope from the
same opening as serve (txevents.py): after every restart, mid-transaction included, nothing is
lost, order is kept, and serve never finds a child's envelope other than its own."""

from __future__ import annotations

import orjson

from chaos.runner import RunContext
from chaos.scenarios.crash_recovery import crash_under_writes
from chaos.scenarios.rig import mariadb_rig


def run(ctx: RunContext) -> None:
    with mariadb_rig(ctx) as rig:
        rig.add_kafka()
        crash_under_writes(ctx, rig)
        log = (ctx.workdir / "log.jsonl").read_bytes().splitlines()
        events = [orjson.loads(line).get("event") for line in log if line.startswith(b"{")]
        ctx.expect("child envelopes other than serve's", events.count("child_envelope_mismatch"), 0)
