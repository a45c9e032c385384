"""serve SIGKILLed at random moments (seeded), mid-transaction and mid-checkpoint included,
while rows are written: after each restart it resumes from its checkpoints; nothing lost, order
kept, and Redis (exactly_once) holds each change once."""

from __future__ import annotations

import random
import time

from chaos.runner import RunContext
from chaos.scenarios.rig import Rig, postgres_rig


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.add_redis(exactly_once=True)
        crash_under_writes(ctx, rig)


def crash_under_writes(ctx: RunContext, rig: Rig) -> None:
    """Start ``rig`` with a seeded batch size, write 200 rows a second, SIGKILL serve at seeded
    random moments (5 times, or one per 4 s of ``--duration``), then verify every sink."""
    rng = random.Random(ctx.seed)
    kills = 5 if ctx.duration is None else max(1, int(ctx.duration // 4))
    rig.start(batch={"max_events": rng.choice([7, 50, 300]), "max_ms": 20, "respect_source_tx": False})
    rig.workload.start(per_second=200)
    for _ in range(kills):
        time.sleep(rng.uniform(0.3, 2.5))  # the crash point: random, by design
        rig.restart()
    ctx.figures["kills"] = kills
    rig.verify()
