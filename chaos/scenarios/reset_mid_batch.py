"""Connection resets (TCP RST) while batches are in flight to the PostgreSQL target and to
Redis, several rounds: each failed batch is retried, the target ends equal to the source and
Redis holds each change once."""

from __future__ import annotations

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        target = rig.add_postgres_target()
        serve = rig.start()
        rig.workload.start()
        assert redis.proxy is not None and target.proxy is not None
        for _ in range(3):
            rig.progress(len(rig.delivered()))
            before = serve.get("/pipelines/chaos").json()["counters"]["sinks"]
            errors = sum(s["errors"] for s in before.values())
            for proxy in (redis.proxy, target.proxy):
                proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 50})

            def reset_seen(errors: int = errors) -> bool:
                now = serve.get("/pipelines/chaos").json()["counters"]["sinks"]
                return bool(sum(s["errors"] for s in now.values()) > errors)

            wait_for(reset_seen, 60, "a batch failed by a reset")
            for proxy in (redis.proxy, target.proxy):
                proxy.destroy_toxic("reset_peer_upstream")
        rig.verify()
