"""PostgreSQL failover behind a stable address: a physical standby is promoted while rows are
written, a slot is created on it, and the source's proxy is pointed at it (a VIP or DNS switch;
the DSN never changes). The FailoverReconciler sees the new timeline, finds the checkpoint
reachable, and streaming continues on the new primary from its slot: nothing lost or skipped."""

from __future__ import annotations

import httpx
import psycopg

from chaos.harness import postgres_workload
from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig, wait_for
from tests.servers.postgres import Standby


def _one(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql.encode())
        row = cur.fetchone() if cur.description else None
    return row[0] if row else None


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        standby = rig.stack.enter_context(Standby(rig.pg))
        rig.start()
        rig.workload.start()
        rig.progress(300)
        rig.workload.stop()  # the old primary is about to fail
        target = _one(rig.pg.dsn(), "SELECT pg_current_wal_lsn()::text")
        wait_for(lambda: bool(_one(standby.dsn(), f"SELECT pg_last_wal_replay_lsn() >= '{target}'")), 30,
                 "the standby caught up")  # fmt: skip
        rig.pg.halt()
        standby.promote()
        _one(standby.dsn(), "CHECKPOINT")
        _one(standby.dsn(), "SELECT pg_create_logical_replication_slot('chaos', 'pgoutput')::text")
        proxies = ctx.proxies
        url = f"http://{proxies.host}:{proxies.port}/proxies/postgres"
        httpx.patch(url, json={"upstream": f"127.0.0.1:{standby.port}"}).raise_for_status()
        rig.workload.execute = postgres_workload(standby.dsn(), ctx.seed).execute  # writes go to B now
        rig.workload.start()
        rig.progress(len(rig.delivered()) + 300)
        assert rig.serve is not None
        [record] = rig.serve.get("/pipelines/chaos/reconcile").json()
        ctx.expect("reconcile result", record["result"], "reachable")
        ctx.figures["timeline"] = record["now"]["timeline"]
        rig.verify()
