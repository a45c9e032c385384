"""A random fault every few seconds for ``--duration`` (default 60 s): the source or Redis
down, latency, resets, serve SIGKILLed. All assertions at the end: nothing lost, order kept,
Redis once each, recovered by itself."""

from __future__ import annotations

import random
import time

from chaos.runner import RunContext
from chaos.scenarios.rig import Rig, postgres_rig


def _fault(rig: Rig, rng: random.Random) -> str:
    redis = rig.sinks["redis"].proxy
    assert redis is not None
    kind = rng.choice(["source_down", "redis_down", "latency", "reset", "kill"])
    hold = rng.uniform(1, 4)
    if kind == "kill":
        rig.restart()
        return kind
    if kind in ("source_down", "redis_down"):
        proxy = rig.source_proxy if kind == "source_down" else redis
        proxy.disable()
        time.sleep(hold)  # the fault lasts this long
        proxy.enable()
        return kind
    proxy = rng.choice([rig.source_proxy, redis])
    toxic = "latency" if kind == "latency" else "reset_peer"
    attributes = {"latency": 200, "jitter": 100} if kind == "latency" else {"timeout": 20}
    proxy.add_toxic(type=toxic, stream="upstream", attributes=attributes)
    time.sleep(hold)  # the fault lasts this long
    proxy.destroy_toxic(f"{toxic}_upstream")
    return kind


def run(ctx: RunContext) -> None:
    rng = random.Random(ctx.seed)
    with postgres_rig(ctx) as rig:
        rig.add_redis(exactly_once=True)
        rig.start()
        rig.workload.start()
        faults: list[str] = []
        deadline = time.monotonic() + (ctx.duration or 60)
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1, 3))  # time between faults: random, by design
            faults.append(_fault(rig, rng))
        ctx.figures["faults"] = len(faults)
        rig.verify(recover_timeout=180)
