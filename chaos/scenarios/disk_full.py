"""serve may not grow any file for 10 s while rows are written: its file sink, its SQLite state
store and its log file all have their writes refused by the kernel, as on a full disk (the
process's RLIMIT_FSIZE lowered to 0 from outside with prlimit: EFBIG, where a full disk gives
ENOSPC); a Redis sink, another process, keeps taking batches. Unavailable is not crashed:
degraded meanwhile (the file sink and the state store listed), no actor restarted, recovered by
itself once writes are allowed, nothing lost, Redis holding each change once; the log says how
many lines it lost. Then serve is stopped and started again on the full disk: the state store
cannot even be opened (SQLite cannot create its WAL files), which is waited for the same way."""

from __future__ import annotations

import resource
import time
from typing import Any

import orjson

from chaos.runner import RunContext
from chaos.scenarios.rig import PIPELINE, postgres_rig, wait_for
from tests.serve_proc import Serve


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        # Redis (another process) takes every batch, so checkpoints are written, and refused; the
        # file sink, not required, falls behind and catches up afterwards.
        rig.add_redis(exactly_once=True)
        serve = rig.start(file={"required": False})
        rig.workload.start()
        rig.progress(200)
        pid = serve.proc.pid
        limits = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, limits[1]))
        try:
            wait_for(rig.degraded, 30, "/health degraded")
            down: set[str] = set()
            until = time.monotonic() + 10  # the full disk itself, what is listed as down watched
            while time.monotonic() < until:
                down |= set(rig.health().get("unavailable", {}).get(PIPELINE, {}))
                time.sleep(0.2)
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, limits)
        ctx.expect("listed as down", sorted(down), ["sink:file", "state_store"])
        ctx.expect("actors restarted", _restarts(serve.get(f"/pipelines/{PIPELINE}/actors").json()), 0)
        ctx.expect("serve exit code after the fault", serve.terminate(), 0)  # its store closed cleanly
        started_at = time.monotonic()

        def full_disk(spawned: Serve) -> None:  # long before serve opens its store
            resource.prlimit(spawned.proc.pid, resource.RLIMIT_FSIZE, (0, limits[1]))

        serve = rig.launch(full_disk)
        try:
            wait_for(rig.degraded, 30, "/health degraded on a start on the full disk")
            ctx.figures["start on the full disk: degraded after s"] = round(time.monotonic() - started_at, 1)
            ctx.expect(
                "listed as down at start", sorted(rig.health()["unavailable"][PIPELINE]), ["state_store"]
            )
            ctx.expect(
                "pipeline state at start", serve.get(f"/pipelines/{PIPELINE}").json()["state"], "starting"
            )
        finally:
            resource.prlimit(serve.proc.pid, resource.RLIMIT_FSIZE, limits)
        rig.verify()
        events = [orjson.loads(line) for line in (ctx.workdir / "log.jsonl").read_bytes().splitlines()
                  if line.startswith(b"{")]  # fmt: skip
        lost = [e for e in events if e.get("event") == "log_lines_lost"]
        ctx.figures["log lines lost"] = sum(int(e["count"]) for e in lost)
        ctx.expect("log says it lost lines", bool(lost), True)
        ctx.expect("restarts in the log", sum(1 for e in events if e.get("event") == "child_restarted"), 0)


def _restarts(node: dict[str, Any]) -> int:
    """Restarts of every actor in a supervisor tree as the API shows it (a log line about one
    written during the fault may be among the lines lost)."""
    return int(node.get("restarts", 0)) + sum(_restarts(c) for c in node.get("children", []))
