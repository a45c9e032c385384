"""The replication slot is dropped while serve is stopped: at start it halts with
``position lost: replication slot 'chaos' does not exist … Re-snapshot required.``, /health 503,
and it does not silently start over from the slot's new beginning."""

from __future__ import annotations

import psycopg

from chaos.runner import RunContext
from chaos.scenarios.rig import halts_saying, postgres_rig


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
        want = "position lost: replication slot 'chaos' does not exist"
        reasons = halts_saying(ctx, serve, want, "Re-snapshot required.", timeout=60)
        ctx.figures["reason"] = reasons[:120]
