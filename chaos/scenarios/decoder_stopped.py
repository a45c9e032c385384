"""A decoder child that stops answering: the source's decoder process (MariaDB's or
PostgreSQL's, by the seed) SIGSTOPped under writes, as a cgroup freezer or a stuck process
would leave it, and never resumed. It says nothing, not even that it is alive; past its stream's
silence bound plus 10 s the reader fails naming it, its restart starts another child, and every
change arrives, in order."""

from __future__ import annotations

import contextlib
import time

import psutil

from chaos.runner import RunContext
from chaos.scenarios.rig import seeded_rig, wait_for

BOUND_S = {"mysql": 10 + 10, "postgres": 2 + 10}  # the stream's silence bound + the slack


def run(ctx: RunContext) -> None:
    kind, rig_cm = seeded_rig(ctx)
    with rig_cm as rig:
        serve = rig.start(source={} if kind == "mysql" else {"receiver_timeout_ms": 2000})
        rig.workload.start()
        rig.progress(100)
        module = f"deltaforge.sources.{kind}.decoder"
        [child] = [p for p in psutil.Process(serve.proc.pid).children() if module in p.cmdline()]
        child.suspend()
        began, stopped_at = time.monotonic(), len(rig.delivered())
        try:
            wait_for(lambda: len(rig.delivered()) > stopped_at + 100, BOUND_S[kind] + 60, "changes again")
            ctx.figures["replaced_after_s"] = round(time.monotonic() - began, 1)
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.resume()  # if it still exists: its replacement ended it already
        said = [line for line in (ctx.workdir / "log.jsonl").read_text().splitlines()
                if f"decoder process {child.pid} said nothing" in line]  # fmt: skip
        ctx.expect("the stopped child named", bool(said), True)
        rig.verify()
