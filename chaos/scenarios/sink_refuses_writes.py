"""Redis, an optional sink, refusing writes under writes (``min-replicas-to-write 1`` and no
replica: ``NOREPLICAS``): it answers ``PING`` and ``INFO`` while every write is refused, so it
comes back, fails its first batch and lags again, over and over, and each comeback
reads the MariaDB binlog again from its checkpoint. The source link is held to 100 KB/s, so that
re-reading takes long, as a long backlog's does. Before, once a re-reading took longer than the
next comeback, the required file sink got nothing new for good; now it goes on getting every
change while Redis refuses, and Redis, taking writes again, catches up with each change once (at
its next comeback, which waits four times as long as its last re-reading took). (Out of memory
would not stage it: the probe reads ``INFO memory`` and does not take such a server for back,
``sinks/redis_memory.py``.)"""

from __future__ import annotations

import time

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import mariadb_rig, settle

REFUSED_S = 30
"""How long Redis refuses writes."""
DELIVERED_S = 90
"""How long the file sink is given, Redis still refusing, to hold what was committed by then."""
REJOIN_S = 180
"""How long Redis is given, taking writes again, to hold what was committed by then."""


def run(ctx: RunContext) -> None:
    with mariadb_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        redis.entry["config"]["required"] = False
        # Comebacks as often as half a second apart: the fault shows within the scenario's time.
        rig.start(supervision={"backoff": {"base_ms": 50, "max_ms": 500}})
        rig.workload.start(per_second=200)
        rig.progress(0)
        rig.source_proxy.add_toxic(type="bandwidth", stream="downstream", attributes={"rate": 100})
        admin = redis.server.client()
        admin.config_set("min-replicas-to-write", 1)  # it has none: every write refused, PING answered
        time.sleep(REFUSED_S)  # the refusal lasts this long
        committed = set(rig.workload.committed)
        took = settle(rig.delivered, committed, DELIVERED_S)
        if took is None:
            missing = len(committed - set(rig.delivered()))
            raise Failed(f"the file sink lacks {missing} of the {len(committed)} changes committed "
                         f"{REFUSED_S} s into Redis refusing writes, {DELIVERED_S} s later")  # fmt: skip
        ctx.figures["file_sink_held_them_after_s"] = round(took, 1)
        log = (ctx.workdir / "log.jsonl").read_text()
        ctx.figures["redis_comebacks"] = log.count('"event":"sink_back"')
        if ctx.figures["redis_comebacks"] < 2:
            raise Failed("Redis never came back while refusing writes: the scenario did not stage the fault")
        admin.config_set("min-replicas-to-write", 0)
        rig.source_proxy.destroy_toxic("bandwidth_downstream")
        # Its next comeback waits four times as long as its last re-reading took (rereading.py).
        back = settle(redis.read, set(rig.workload.committed), REJOIN_S, quiet=REJOIN_S)
        ctx.figures["redis_caught_up_after_s"] = round(back, 1) if back is not None else "never"
        rig.verify()
