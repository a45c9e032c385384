"""Poison events through ``serve``: the PostgreSQL target refuses some row versions (a CHECK
constraint) while the workload runs. Each refused change goes to the dead-letter queue with its
coordinates, everything else is delivered and checkpointed. Then the operator drops the
constraint, replays over REST the dead letters whose rows still exist and acks the others, and
the target ends equal to the source."""

from __future__ import annotations

import httpx
import psycopg

from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import postgres_rig, wait_for


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.add_postgres_target()
        with psycopg.connect(rig.pg.dsn("target"), autocommit=True) as conn:
            conn.execute("ALTER TABLE items ADD CONSTRAINT no_seven CHECK (ver % 10 <> 7)")
        serve = rig.start(journal={"enabled": True})
        rig.workload.start()
        rig.progress(400)
        # The seeded workload reaches a refused version (ver 7) at a pace of its own: with seed 2
        # not within the first 400 changes. Wait for one to be committed, not for a count.
        wait_for(lambda: any(ver % 10 == 7 for op, _, ver in list(rig.workload.committed) if op != "d"),
                 120, "a change the target refuses committed")  # fmt: skip
        rig.workload.stop()
        api = serve.url("/pipelines/chaos/journal/dlq")
        wait_for(lambda: httpx.get(f"{api}/count").json()["count"] > 0, 60, "poison events in the DLQ")
        total = len(rig.workload.committed)
        wait_for(lambda: serve.get("/pipelines/chaos").json()["counters"]["events_committed"] >= total, 60,
                 "every change committed (so no more dead letters come)")  # fmt: skip
        entries = httpx.get(f"{api}?limit=100000").json()
        for e in entries:
            if e["sink"] != "target" or e["kind"] != "rejected" or "no_seven" not in e["error"]:
                raise Failed(f"an unexpected dead letter: {e}")
            if not e["position"] or e["event"]["after"]["ver"] % 10 != 7:
                raise Failed(f"a dead letter without its coordinates, or of a row the target accepts: {e}")
        ctx.figures["dead_letters"] = len(entries)
        with psycopg.connect(rig.pg.dsn("target"), autocommit=True) as conn:
            conn.execute("ALTER TABLE items DROP CONSTRAINT no_seven")  # the operator's fix
        # A dead letter is an old change: replayed after its row was deleted, it would bring the
        # row back (the target keeps no tombstones). The operator replays what is still live and
        # acks the rest, as the README says.
        live = {key for _, key, _ in rig.final_rows()}
        keep = [e["seq"] for e in entries if e["event"]["after"]["id"] in live]
        gone = [e["seq"] for e in entries if e["seq"] not in keep]
        replayed = httpx.post(f"{api}/replay", json={"seqs": keep}, timeout=120).json()
        acked = httpx.post(f"{api}/ack", json={"seqs": gone}, timeout=30).json()
        ctx.expect("replayed", replayed.get("replayed"), len(keep))
        ctx.expect("acked", acked.get("acked"), len(gone))
        ctx.expect("dead letters left", httpx.get(f"{api}/count").json()["count"], 0)
        ctx.figures["replayed"], ctx.figures["acked_deleted_since"] = len(keep), len(gone)
        rig.verify()
