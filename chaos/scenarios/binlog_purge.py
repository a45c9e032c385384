"""MariaDB: the binlogs holding changes serve has not read yet are purged while it is stopped. At start it
halts with ``position lost: … Re-snapshot required.``, /health 503 — never a silent jump."""

from __future__ import annotations

import contextlib

from chaos.harness import mariadb_workload, port_of
from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import wait_for
from tests.serve_proc import Serve
from tests.servers.mariadb import MariaDB


def run(ctx: RunContext) -> None:
    with contextlib.ExitStack() as stack:
        db = stack.enter_context(MariaDB())
        with db.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
        proxy = ctx.proxies.proxy("mariadb", f"127.0.0.1:{db.port}")
        dsn = db.dsn("shop").replace(f":{db.port}", f":{port_of(proxy)}")
        workload = mariadb_workload(lambda: db.root("shop"), ctx.seed)
        cfg = ctx.pipeline("chaos", {
            "source": {"type": "mysql", "config": {"id": "my", "dsn": dsn, "tables": ["shop.items"]}},
            "sinks": [{"type": "file", "config": {"id": "file", "path": str(ctx.workdir / "events.jsonl")}}],
            "storage": {"type": "sqlite", "path": str(ctx.workdir / "checkpoints.db")},
        })  # fmt: skip
        args = ("--config", str(cfg), "--log-file", str(ctx.workdir / "log.jsonl"))
        serve = stack.enter_context(Serve(ctx.workdir, *args))
        serve.wait_api()
        serve.wait_source_open("chaos")
        for _ in range(20):
            workload.transaction()
        wait_for(lambda: (ctx.workdir / "events.jsonl").exists(), 60, "first changes delivered")
        ctx.expect("serve exit code", serve.terminate(), 0)
        for _ in range(20):  # changes serve has not read, in binlogs about to be purged
            workload.transaction()
        db.purge_all_but_newest("mysql-bin.000001")
        serve = stack.enter_context(Serve(ctx.workdir, *args))
        serve.wait_api()
        took = wait_for(lambda: serve.get("/health").status_code == 503, 60, "/health 503")
        ctx.figures["halted_after_s"] = round(took, 1)
        reasons = " ".join(serve.get("/health").json().get("reasons", []))
        if "position lost" not in reasons or "Re-snapshot required." not in reasons:
            raise Failed(f"/health does not say why: {reasons!r}")
        ctx.figures["reason"] = reasons[:120]
