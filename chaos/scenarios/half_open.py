"""A half-open sink connection: the timeout toxic (0: hold, drop everything) on Redis for 25 s.
The stalled connection must be detected (socket timeout) and replaced, the pipeline degraded
meanwhile, and once the toxic goes every change arrives once."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        rig.start()
        rig.workload.start()
        rig.progress(0)
        assert redis.proxy is not None
        redis.proxy.add_toxic(type="timeout", attributes={"timeout": 0})
        redis.proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        wait_for(rig.degraded, 60, "/health degraded (a stalled connection detected)")
        time.sleep(10)  # the stall goes on
        redis.proxy.destroy_toxic("timeout_downstream")
        redis.proxy.destroy_toxic("timeout_upstream")
        rig.verify()
