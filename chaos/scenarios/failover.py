"""MariaDB failover behind a stable address: the primary A is stopped while rows are written, its
GTID replica B is promoted, and the source's proxy is pointed at B (a VIP or DNS switch; the DSN
never changes). The FailoverReconciler finds A's checkpoint in B's binlog state, reading resumes
on B by GTID in a new failover generation, and the workload goes on against B: nothing lost or
skipped across the switch, although B's binlog coordinates start below A's."""

from __future__ import annotations

import contextlib

import httpx

from chaos.harness import checks, file_changes, mariadb_workload, port_of
from chaos.runner import RunContext
from chaos.scenarios.rig import settle, wait_for
from tests.serve_proc import Serve
from tests.servers.mariadb import MariaDB


def run(ctx: RunContext) -> None:
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(MariaDB())
        with a.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            for _ in range(3):
                cur.execute("FLUSH BINARY LOGS")  # A's binlog numbers run ahead of B's
        b = stack.enter_context(a.replica())
        proxy = ctx.proxies.proxy("mariadb", f"127.0.0.1:{a.port}")
        dsn = a.dsn("shop").replace(f":{a.port}", f":{port_of(proxy)}")
        events = ctx.workdir / "events.jsonl"
        cfg = ctx.pipeline("chaos", {
            "source": {"type": "mysql", "config": {"id": "my", "dsn": dsn, "tables": ["shop.items"]}},
            "sinks": [{"type": "file", "config": {"id": "file", "path": str(events)}}],
            "batch": {"max_events": 200, "max_ms": 50},
            "storage": {"type": "sqlite", "path": str(ctx.workdir / "checkpoints.db")},
        })  # fmt: skip
        workload = mariadb_workload(lambda: a.root("shop"), ctx.seed)
        stack.callback(workload.stop_quietly)
        serve = stack.enter_context(
            Serve(ctx.workdir, "--config", str(cfg), "--log-file", str(ctx.workdir / "log.jsonl"))
        )
        serve.wait_api()
        serve.wait_source_open("chaos")

        def delivered_more_than(n: int) -> None:
            wait_for(lambda: len(file_changes(events)) > n, 60, f"more than {n} changes delivered")

        workload.start()
        delivered_more_than(300)
        workload.stop()  # A is about to fail
        target = a.gtid_binlog_pos()
        wait_for(lambda: b.gtid_binlog_pos() == target, 30, "the replica caught up")
        a.halt()
        b.promote()
        url = f"http://{ctx.proxies.host}:{ctx.proxies.port}/proxies/mariadb"
        httpx.patch(url, json={"upstream": f"127.0.0.1:{b.port}"}).raise_for_status()
        workload.execute = mariadb_workload(lambda: b.root("shop"), ctx.seed).execute  # writes go to B now
        workload.start()
        delivered_more_than(len(file_changes(events)) + 300)
        workload.stop()
        [record] = serve.get("/pipelines/chaos/reconcile").json()
        ctx.expect("reconcile result", record["result"], "reachable")
        ctx.figures["server_id"] = f"{record['previous']['server_id']} -> {record['now']['server_id']}"
        committed = list(workload.committed)
        ctx.figures["committed"] = len(committed)
        took = settle(lambda: file_changes(events), set(committed), 120)
        ctx.figures["caught_up_s"] = round(took, 1) if took is not None else "never"
        found = checks(committed, file_changes(events))
        ctx.expect("events lost", found["lost"], 0)
        ctx.expect("phantom events", found["phantoms"], 0)
        ctx.expect("per-key order violations", found["order_violations"], 0)
        wait_for(lambda: serve.get("/health").json().get("status") == "ok", 60, "/health ok")
        ctx.expect("serve exit code", serve.terminate(), 0)
