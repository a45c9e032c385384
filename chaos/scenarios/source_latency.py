"""Latency with jitter on both directions of the source connection (300 ± 100 ms) while rows
are written: slower, never wrong — nothing lost, order kept, no restart needed."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.start()
        rig.workload.start()
        rig.progress(0)
        for stream in ("downstream", "upstream"):
            rig.source_proxy.add_toxic(
                type="latency", stream=stream, attributes={"latency": 300, "jitter": 100}
            )
        done = len(rig.delivered())
        time.sleep(10)  # the latency lasts this long
        ctx.figures["delivered_under_latency"] = len(rig.delivered()) - done
        rig.progress(done)  # progress under latency
        for stream in ("downstream", "upstream"):
            rig.source_proxy.destroy_toxic(f"latency_{stream}")
        rig.verify()
