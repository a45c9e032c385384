"""``serve`` itself stopped and resumed: the whole process SIGSTOPped for 70 s under writes, as a
paused VM, a frozen container or a laptop's lid leaves it, then SIGCONTed. Its servers see every
connection silent meanwhile: PostgreSQL ends the replication stream past ``wal_sender_timeout``
(60 s), and the source's decoder child exits with it. Once resumed, the pipeline must reopen by
itself, close what went away whole (``on_stop_failed`` none: a confirmation sent to the child
after it exited stayed in its pipe and failed the source's close), and deliver every change, in
order, once where promised."""

from __future__ import annotations

import time

import psutil

from chaos.runner import RunContext
from chaos.scenarios.rig import postgres_rig

PAUSE_S = 70.0
"""Past the server's ``wal_sender_timeout`` (60 s by default): the stream is ended meanwhile."""


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.add_redis(exactly_once=True)
        rig.add_kafka()
        serve = rig.start()
        rig.workload.start()
        rig.progress(100)
        process = psutil.Process(serve.proc.pid)
        process.suspend()
        try:
            time.sleep(PAUSE_S)  # the pause itself: serve does nothing meanwhile, whatever happens
        finally:
            process.resume()
        ctx.figures["paused_s"] = PAUSE_S
        delivered = len(rig.delivered())
        rig.progress(delivered + 100)
        log = (ctx.workdir / "log.jsonl").read_text()
        ctx.figures["restarts after the pause"] = log.count('"child_restarted"') + log.count(
            '"child_unavailable"'
        )
        ctx.expect("clean-ups that failed (on_stop_failed)", log.count('"on_stop_failed"'), 0)
        # Its decoder child ran on meanwhile: serve was the one paused (a live child taken for
        # stopped restarted the source in the full run of 7 Dec, seed 3401: childproc.UNWATCHED_S).
        ctx.expect("decoder taken for stopped", log.count("said nothing for"), 0)
        # Nor was a sink, the store or Spark unanswered: the watches count serve's running time
        # (seed 3402 listed Kafka "delivery unanswered for 30 s" for 4 ms; runningtimer.py).
        ctx.expect("watches set off by the pause", log.count("unanswered for"), 0)
        rig.verify()
