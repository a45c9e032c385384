"""The source is unreachable for 15 s while rows are written at 300 transactions a second; when
it is back the backlog drains: every change arrives, and the drain rate is reported, timed from
the first change delivered after the source's return (the time before it, the rest of the restart
backoff and the reconnection, is reported on its own)."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.start()
        rig.workload.start(per_second=300)
        rig.progress(0)
        rig.source_proxy.disable()
        time.sleep(15)  # the backlog builds up
        rig.workload.stop()
        backlog = len(rig.workload.committed) - len(rig.delivered())
        held = len(rig.delivered())
        rig.source_proxy.enable()
        want = set(rig.workload.committed)
        back = wait_for(lambda: len(rig.delivered()) > held, 120, "a first change after the source's return")
        took = wait_for(lambda: want <= set(rig.delivered()), 120, "the backlog drained")
        ctx.figures["backlog_changes"] = backlog
        ctx.figures["first_change_after_return_s"] = round(back, 1)
        ctx.figures["drain_changes_per_s"] = round(backlog / max(took, 0.001))
        rig.verify()
