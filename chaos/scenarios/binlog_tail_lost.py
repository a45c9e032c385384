"""MariaDB: the server's machine crashes with sync_binlog=0 (MariaDB's default), and the end of the
binlog, which serve had read and delivered, was never on disk. The server starts again in a new
binlog file and writes new transactions under the lost ones' GTIDs. Reading on from the
checkpoint's GTID would take those as read and skip them without a word; serve halts with
``position lost: … Re-snapshot required.``, /health 503.

SIGKILL and the binlog file cut at a transaction's start stand in for the machine's crash and its
lost page cache; serve's proxy is down meanwhile, so it meets the server only once the new
transactions have taken the server's GTID state past the checkpoint's (the GTIDs alone look fine)."""

from __future__ import annotations

import contextlib
import os
import signal

from chaos.harness import file_changes
from chaos.runner import RunContext
from chaos.scenarios.rig import halts_saying, mariadb_to_file, wait_for
from tests.serve_proc import Serve


def run(ctx: RunContext) -> None:
    with contextlib.ExitStack() as stack:
        rig = mariadb_to_file(ctx, stack)
        db, workload, events = rig.db, rig.workload, rig.events
        serve = stack.enter_context(Serve(ctx.workdir, *rig.args))
        serve.wait_api()
        serve.wait_source_open("chaos")
        for _ in range(20):
            workload.transaction()
        wait_for(lambda: len(file_changes(events)) == len(workload.committed), 60, "every change delivered")
        with db.root() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            binlog = str(cur.fetchone()[0])
            cur.execute("SHOW BINLOG EVENTS IN %s", (binlog,))
            cut = [int(e[1]) for e in cur.fetchall() if e[2] == "Gtid"][-10]  # ten delivered, then lost
            cur.execute("SELECT @@gtid_binlog_pos")
            before = str(cur.fetchone()[0])
        rig.proxy.disable()
        assert db.proc is not None
        os.kill(db.proc.pid, signal.SIGKILL)
        db.proc.wait()
        os.truncate(db.data / binlog, cut)
        db.resume()
        for _ in range(20):  # the first ten reuse the lost transactions' GTIDs
            workload.transaction()
        ctx.figures["gtid before the crash"], ctx.figures["gtid now"] = before, db.gtid_binlog_pos()
        rig.proxy.enable()
        reasons = halts_saying(ctx, serve, "lost the end of it", "Re-snapshot required.")
        ctx.figures["reason"] = reasons[reasons.find("binlog file") :][:140]
