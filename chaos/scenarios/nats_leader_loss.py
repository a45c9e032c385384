"""The NATS server leading the sink's stream is SIGKILLed, twice, while rows are written: a
three-server JetStream cluster holding the stream on all three (R3). Until the other two elect
a new leader (seconds), publishes get "no responders"; that is a stream without a leader, not a
missing stream: degraded meanwhile, never halted, each change in the stream once (Nats-Msg-Id
deduplicates what was retried)."""

from __future__ import annotations

import asyncio

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for
from tests.servers.nats import stream_leader


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        _, cluster = rig.add_nats_cluster()
        rig.start()
        rig.workload.start()
        for round_ in range(2):
            rig.progress(len(rig.delivered()))
            # Every replica current before a node goes: losing one then loses nothing acked.
            leader = asyncio.run(stream_leader(cluster.nodes[0].url(), "CDC"))
            cluster.kill(leader)
            ctx.figures[f"round {round_ + 1}: degraded after s"] = round(
                wait_for(rig.degraded, 30, "/health degraded"), 1
            )
            wait_for(lambda: rig.health().get("status") == "ok", 60, "/health ok with a new leader")
            cluster.node(leader).start()
        rig.verify()
