"""MariaDB: a byte of a binlog event changes on the server's disk while serve is stopped (a bad
disk, a bad copy). At start serve delivers every transaction before the damaged one, then halts
naming the event's file:position, /health 503; the damaged transaction and everything after it are
never delivered."""

from __future__ import annotations

import contextlib

from chaos.harness import file_changes
from chaos.runner import RunContext
from chaos.scenarios.rig import halts_saying, mariadb_to_file, wait_for
from tests.helpers import damage_on_disk
from tests.serve_proc import Serve

MARK = b"damage-here"


def run(ctx: RunContext) -> None:
    with contextlib.ExitStack() as stack:
        rig = mariadb_to_file(ctx, stack)
        db, workload, args, events = rig.db, rig.workload, rig.args, rig.events
        serve = stack.enter_context(Serve(ctx.workdir, *args))
        serve.wait_api()
        serve.wait_source_open("chaos")
        for _ in range(20):
            workload.transaction()
        wait_for(lambda: len(file_changes(events)) == len(workload.committed), 60, "first changes delivered")
        ctx.expect("serve exit code", serve.terminate(), 0)
        for _ in range(10):  # read at the next start, before the damage
            workload.transaction()
        before = list(workload.committed)
        workload.execute(
            [("INSERT INTO items (id, ver, payload) VALUES (%s, 1, %s)", (10**6, MARK.decode()))]
        )
        for _ in range(10):  # after the damage: never delivered
            workload.transaction()
        with db.root() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            binlog = db.data / str(cur.fetchone()[0])
            cur.execute("FLUSH BINARY LOGS")  # that file is closed: nothing writes it again
        damage_on_disk(binlog, MARK)  # in the rows event (the statement's annotation holds it first)
        serve = stack.enter_context(Serve(ctx.workdir, *args))
        serve.wait_api()
        reasons = halts_saying(ctx, serve, "CRC32 checksum", f"{binlog.name}:")
        ctx.figures["reason"] = reasons[reasons.find("the binlog event") :][:100]
        got = file_changes(events)
        ctx.figures["delivered"], ctx.figures["before the damage"] = len(got), len(before)
        ctx.expect("the file holds exactly the changes before the damage, in order", got == before, True)
