"""A Spark JVM that stops answering: the pipeline's JVM (a mask on every change) SIGSTOPped for
a seeded 40 to 60 s under writes, then SIGCONTed. Every batch waits for the job meanwhile; the
pipeline must say so (degraded: ``transform``), not pass for running, and once the JVM answers
every change arrives, in order."""

from __future__ import annotations

import random
import time

import psutil

from chaos.runner import RunContext
from chaos.scenarios.rig import PIPELINE, postgres_rig, wait_for
from deltaforge.pipeline.transformer import UNANSWERED_S

JVM_START_S = 180.0


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        serve = rig.start(processors=[{"type": "mask", "columns": {"payload": "hash"}}])
        rig.workload.start()
        rig.progress(0, timeout=JVM_START_S)  # through Spark: the JVM is up
        [java] = [p for p in psutil.Process(serve.proc.pid).children(recursive=True) if p.name() == "java"]
        stopped_s = random.Random(ctx.seed).uniform(UNANSWERED_S + 10, UNANSWERED_S + 30)
        ctx.figures["jvm_stopped_s"] = round(stopped_s, 1)
        java.suspend()
        began = time.monotonic()
        try:
            said = wait_for(rig.degraded, stopped_s, "/health degraded (a Spark job unanswered)")
            ctx.figures["degraded_after_s"] = round(said, 1)
            listed = rig.health().get("unavailable", {}).get(PIPELINE, {})
            ctx.expect("transform listed unavailable", "transform" in listed, True)
            time.sleep(max(0.0, stopped_s - (time.monotonic() - began)))  # the JVM stays stopped
        finally:
            java.resume()
        rig.verify()
