"""Every byte of the replication stream and of the Redis protocol arrives in small slices
(slicer: 32 ± 16 bytes, 10 µs apart), both ways, for the whole run: every protocol message
is cut up, and the parsers cope; nothing lost, nothing duplicated."""

from __future__ import annotations

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        redis = rig.add_redis(exactly_once=True)
        assert redis.proxy is not None
        slices = {"average_size": 32, "size_variation": 16, "delay": 10}
        for proxy in (rig.source_proxy, redis.proxy):
            for stream in ("downstream", "upstream"):
                proxy.add_toxic(type="slicer", stream=stream, attributes=slices)
        rig.start(batch={"max_events": 50, "max_ms": 20})
        rig.workload.start()
        rig.progress(300, timeout=120)
        rig.verify()
