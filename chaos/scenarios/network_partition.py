"""The source's network goes away (proxy disabled: connections dropped, new ones refused) for
10 s, several rounds, while rows are written. Unavailable is not crashed: degraded meanwhile,
recovered by itself, nothing lost, per-key order kept."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    rounds = 3 if ctx.duration is None else max(1, int(ctx.duration // 15))
    with postgres_rig(ctx) as rig:
        rig.start()
        rig.workload.start()
        for _ in range(rounds):
            rig.progress(len(rig.delivered()))
            rig.source_proxy.disable()
            wait_for(rig.degraded, 30, "/health degraded")
            time.sleep(10)  # the partition itself
            rig.source_proxy.enable()
        rig.verify()
