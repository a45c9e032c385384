"""MariaDB: the binlogs holding changes serve has not read yet are purged while it is stopped. At start it
halts with ``position lost: … Re-snapshot required.``, /health 503 — never a silent jump."""

from __future__ import annotations

import contextlib

from chaos.runner import RunContext
from chaos.scenarios.rig import halts_saying, mariadb_to_file, wait_for
from tests.serve_proc import Serve


def run(ctx: RunContext) -> None:
    with contextlib.ExitStack() as stack:
        rig = mariadb_to_file(ctx, stack)
        db, workload, args = rig.db, rig.workload, rig.args
        serve = stack.enter_context(Serve(ctx.workdir, *args))
        serve.wait_api()
        serve.wait_source_open("chaos")
        for _ in range(20):
            workload.transaction()
        wait_for(lambda: rig.events.exists(), 60, "first changes delivered")
        ctx.expect("serve exit code", serve.terminate(), 0)
        for _ in range(20):  # changes serve has not read, in binlogs about to be purged
            workload.transaction()
        db.purge_all_but_newest("mysql-bin.000001")
        serve = stack.enter_context(Serve(ctx.workdir, *args))
        serve.wait_api()
        reasons = halts_saying(ctx, serve, "position lost", "Re-snapshot required.", timeout=60)
        ctx.figures["reason"] = reasons[:120]
