"""A stop while the source's server is frozen: the database (MariaDB or PostgreSQL, by the seed)
SIGSTOPped under writes, alive but answering nothing (a stopped process, a frozen host: the
kernel still accepts connections), and ``serve`` told to stop once the pipeline is degraded. The
stop must not wait for questions that server will not answer (the reopening's, held for
``query_timeout_s``), nor for the backoff before the reader's next attempt: the process exits
at once. The server resumed, ``serve`` started again delivers every change, in order."""

from __future__ import annotations

import signal
import time

from chaos.runner import RunContext
from chaos.scenarios.rig import Rig, seeded_rig, wait_for
from tests.servers.base import paused

STOP_S = 15.0
"""How soon a stop must end: the drain's grace for a read in progress (5 s) and the source's
close, with room; before, a MariaDB stop took 58 s (30 s of drain, then the question's thread)."""


def _server(rig: Rig) -> int:
    pid = rig.mariadb.proc.pid if rig.mariadb is not None and rig.mariadb.proc else rig.pg.server_pid()
    assert pid is not None
    return pid


def run(ctx: RunContext) -> None:
    kind, rig_cm = seeded_rig(ctx)
    with rig_cm as rig:
        serve = rig.start(source={} if kind == "mysql" else {"receiver_timeout_ms": 3000})
        rig.workload.start()
        rig.progress(100)
        with paused(_server(rig)):
            said = wait_for(rig.degraded, 90, "/health degraded (the source answers nothing)")
            ctx.figures["degraded_after_s"] = round(said, 1)
            began = time.monotonic()
            serve.proc.send_signal(signal.SIGTERM)
            code = serve.proc.wait(120)
            took = time.monotonic() - began
        ctx.figures["stopped_after_s"] = round(took, 1)
        ctx.expect("serve exit code at the stop", code, 0)
        ctx.expect(f"stopped within {STOP_S:g} s", took < STOP_S, True)
        log = (ctx.workdir / "log.jsonl").read_text()
        # Drained, or, with the reader down between two attempts (its group restarting, nothing
        # held), skipped: either way nothing read is lost, the next start reads it.
        drain = [e for e in ("drained", "drain_skipped", "drain_incomplete") if f'"pipeline_{e}"' in log]
        ctx.figures["drain"] = ", ".join(drain)
        ctx.expect("pipeline_drain_incomplete logged", "drain_incomplete" in drain, False)
        rig.launch()
        rig.verify()
