"""The replication slot is dropped while serve is stopped: at start it halts with
``position lost: replication slot 'chaos' does not exist … Re-snapshot required.``, /health 503,
and it does not silently start over from the slot's new beginning."""

from __future__ import annotations

import psycopg

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        serve = rig.start()
        rig.workload.start()
        rig.progress(50)
        rig.workload.stop()
        ctx.expect("serve exit code", serve.terminate(), 0)
        with psycopg.connect(rig.pg.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('chaos')")
        serve = rig.launch()
        took = wait_for(lambda: serve.get("/health").status_code == 503, 60, "/health 503")
        ctx.figures["halted_after_s"] = round(took, 1)
        reasons = " ".join(serve.get("/health").json().get("reasons", []))
        want = "position lost: replication slot 'chaos' does not exist"
        if want not in reasons or "Re-snapshot required." not in reasons:
            raise Failed(f"/health does not say why: {reasons!r}")
        ctx.figures["reason"] = reasons[:120]
