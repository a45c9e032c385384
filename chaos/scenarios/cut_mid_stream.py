"""The source connection is cut mid-stream, again and again: limit_data closes every
connection after 64 KB (slow_close delays each close by 200 ms) for 20 s. Each cut is an
outage the reader rides through; afterwards nothing is missing and order holds."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        serve = rig.start()
        rig.workload.start(per_second=150)
        rig.progress(0)
        rig.source_proxy.add_toxic(type="limit_data", attributes={"bytes": 65536})
        rig.source_proxy.add_toxic(type="slow_close", attributes={"delay": 200})
        time.sleep(20)  # the window of cuts
        rig.source_proxy.destroy_toxic("limit_data_downstream")
        rig.source_proxy.destroy_toxic("slow_close_downstream")
        ctx.figures["state_during_cuts"] = serve.get("/pipelines/chaos").json()["state"]
        rig.verify()
