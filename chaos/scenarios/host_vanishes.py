"""The PostgreSQL source's host vanishes for 25 s under the workload, as when it loses its power
or its network: the server lives in a network namespace of its own behind a veth link
(``tests/servers/netns.py``), and the link is taken down. Nothing answers any more, neither a
reset nor a refusal, nor TCP keepalive probes, which a proxy cannot stage (its kernel answers
them). The server learns nothing either: its walsender still holds the slot when the link comes
back, unless it gave up by itself. The stream notices the silence (``receiver_timeout_ms``, 5 s
here): degraded meanwhile; once the link is back the pipeline ends a walsender still holding
the slot (``stale_walsender_ended``), reconnects by itself, and nothing is lost, per-key order
kept. The workload writes over the server's unix socket all along."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for
from tests.servers.netns import Link


def run(ctx: RunContext) -> None:
    with Link() as link, postgres_rig(ctx, link) as rig:
        rig.start(source={"receiver_timeout_ms": 5000})
        rig.workload.start()
        rig.progress(100)
        began = time.monotonic()
        link.cut()
        try:
            took = wait_for(rig.degraded, 30, "/health degraded (the vanished host noticed)")
            ctx.figures["degraded_after_s"] = round(took, 1)
            time.sleep(max(0.0, 25 - (time.monotonic() - began)))  # the host is gone 25 s in all
        finally:
            link.mend()
        rig.verify()
