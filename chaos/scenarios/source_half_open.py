"""A half-open source connection: the timeout toxic (0: hold, drop everything) on the PostgreSQL
source's proxy, both ways, for 25 s under the workload. The server sees nothing either, and its
own wal_sender_timeout (60 s) is longer than the hole. The stream asks for keepalives; none
answered for ``receiver_timeout_ms`` (5 s here) is a lost connection: the pipeline is degraded
meanwhile, and once the toxic goes it reconnects by itself (after the old walsender lets go of
the slot) with nothing lost and per-key order kept."""

from __future__ import annotations

import time

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.start(source={"receiver_timeout_ms": 5000})
        rig.workload.start()
        rig.progress(100)
        began = time.monotonic()
        for stream in ("downstream", "upstream"):
            rig.source_proxy.add_toxic(name=f"hole_{stream}", type="timeout", stream=stream,
                                       attributes={"timeout": 0})  # fmt: skip
        # Well inside the server's own 60 s: only the stream's rule can notice in time.
        took = wait_for(rig.degraded, 30, "/health degraded (the silent stream noticed)")
        ctx.figures["degraded_after_s"] = round(took, 1)
        time.sleep(max(0.0, 25 - (time.monotonic() - began)))  # the hole lasts 25 s in all
        for stream in ("downstream", "upstream"):
            rig.source_proxy.destroy_toxic(f"hole_{stream}")
        rig.verify()
