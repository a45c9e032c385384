"""Two ``serve`` processes of one MariaDB pipeline, active and standby (the run lock beside the
checkpoint store): the active one SIGKILLed at seeded random moments under writes, the standby
takes over from its checkpoints each time, and a new standby is started. A standby reads
nothing while it waits (a binlog read by two processes delivers every change twice). Lost 0,
order 0, Redis (exactly_once) duplicates 0."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from chaos.runner import RunContext
from chaos.scenarios.rig import PIPELINE, mariadb_rig, wait_for
from tests.helpers import jsonl
from tests.serve_proc import Serve


def _said(log: Path, event: str) -> int:
    return sum(1 for r in jsonl(log) if r["event"] == event)


def _saying(log: Path, *events: str) -> Callable[[], bool]:
    """Whether ``log`` has any of ``events`` yet."""
    return lambda: any(_said(log, event) > 0 for event in events)


def run(ctx: RunContext) -> None:
    rng = random.Random(ctx.seed)
    rounds = 3 if ctx.duration is None else max(1, int(ctx.duration // 6))
    with mariadb_rig(ctx) as rig:
        rig.add_redis(exactly_once=True)
        rig.start(batch={"max_events": rng.choice([7, 50, 300]), "max_ms": 20})
        rig.workload.start(per_second=200)
        cfg = ctx.workdir / f"{PIPELINE}.yaml"
        for i in range(rounds):
            log = ctx.workdir / f"standby-{i}.jsonl"
            standby = Serve(ctx.workdir, "--config", str(cfg), "--log-file", str(log))
            try:
                standby.wait_api()
                waiting_or_reading = _saying(log, "pipeline_held_elsewhere", "source_opening")
                wait_for(waiting_or_reading, 30, "the standby waiting (or reading)")
                time.sleep(rng.uniform(0.3, 2.5))  # the kill point: random, by design
                ctx.expect(
                    f"round {i}: standby read before it held the lock", _said(log, "source_opening"), 0
                )
                assert rig.serve is not None
                rig.serve.kill()
                took = wait_for(_saying(log, "pipeline_started"), 30, "the standby taking over")
            except BaseException:
                standby.kill()
                raise
            rig.serve = standby
            ctx.figures[f"round {i}: takeover s"] = round(took, 2)
        ctx.figures["takeovers"] = rounds
        rig.verify()
