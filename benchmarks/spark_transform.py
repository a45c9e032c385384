"""What processors on Spark cost: per-batch latency, and pipeline throughput with and without.

    .venv/bin/python benchmarks/spark_transform.py [--events 200000] [--runs 200]

1. Per-batch latency of ``Plan.run`` (events -> Arrow -> Spark filter+mask -> Arrow -> events)
   for batches of 1k and 10k events, p50 and p99 over ``--runs`` warm runs.
2. Pipeline drain rate (synthetic typed source -> file sink) without processors, then
   with a filter, at max_inflight 1, 2 and 4, all in the same run on a session that is
   already warm (the 13-22 s cold start is paid once per process, not per batch).

Targets (issue 7): <= 100 ms added per batch; >= 50 % of the no-transform rate with
max_inflight >= 2.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Figure, percentile
from benchmarks.drain import drain_rate
from deltaforge import gctune
from deltaforge import logsetup as dflogging
from deltaforge.events import Event, SourceInfo
from deltaforge.pipeline.context import PipelineStats
from deltaforge.position import Position, PositionDoc
from deltaforge.sources.base import DeclaredTable, Source, own_position
from deltaforge.transform.plan import Plan
from deltaforge.transform.rowtypes import table_schema
from deltaforge.transform.session import runtime_for
from deltaforge.transform.spec import ProcessorSpec, SparkConfig
from tests.kit import SeqPosition

COLUMNS = (("id", "INTEGER"), ("customer", "TEXT"), ("email", "TEXT"), ("amount", "REAL"), ("status", "TEXT"))
FILTER = {"type": "filter", "expr": "after.amount > 100", "tables": ["orders"]}
MASK = {"type": "mask", "columns": {"email": "hash"}}


def event(seq: int) -> Event:
    pos = SeqPosition(seq)
    after = {
        "id": seq,
        "customer": f"customer-{seq % 50}",
        "email": f"c{seq % 997}@example.com",
        "amount": float(seq % 500),
        "status": "new",
    }
    return Event("c", None, after, SourceInfo("bench", "shop", "orders", pos, 0), str(seq // 10),
                 seq % 10 == 9, str(seq), (seq,), pos, "bench", 120)  # fmt: skip


class TypedSource(Source):
    """``total`` orders inserts, in transactions of 10, with a declared schema."""

    connector = "turso"  # SQLite type names in COLUMNS

    def __init__(self, total: int) -> None:
        self.id = "bench"
        self.total = total
        self.next = 0

    @staticmethod
    def load_position(doc: PositionDoc) -> SeqPosition:
        return SeqPosition.from_doc(doc)

    async def open(self, resume_after: Position | None) -> None:
        resume = own_position(resume_after, SeqPosition)
        self.next = resume.seq + 1 if resume else 0

    async def read(self) -> list[Event]:
        if self.next >= self.total:
            await asyncio.sleep(0.01)
            return []
        end = min(self.total, self.next + 5000)
        out = [event(s) for s in range(self.next, end)]
        self.next = end
        return out

    async def describe_tables(self) -> list[DeclaredTable]:
        return [DeclaredTable("shop", "orders", COLUMNS)]


def pipeline(
    out: Path, processors: list[dict[str, Any]], inflight: int, size: int, master: str = "local[*]"
) -> dict[str, Any]:
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"bench-{inflight}-{len(processors)}-{size}"},
        "spec": {
            "source": {"type": "turso", "config": {"id": "bench", "path": "unused.db"}},
            "processors": processors,
            "spark": {"master": master},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(out), "fsync": False}}],
            "batch": {"max_events": size, "max_ms": 50, "max_inflight": inflight},
        },
    }


async def drain(doc: dict[str, Any], total: int) -> float:
    # Processors drop events, so "done" is the checkpoint reaching the last one read.
    def done(stats: PipelineStats) -> bool:
        last = stats.last_checkpoint
        return isinstance(last, SeqPosition) and last.seq >= total - 1

    return await drain_rate(doc, total, TypedSource(total), done)


def latency(
    spark_config: SparkConfig, runs: int, warmup: int, sizes: tuple[int, ...] = (1000, 10_000)
) -> list[Figure]:
    """p50 and p99 of one batch through filter + mask, per batch size."""
    gctune.tune()  # what serve runs with
    runtime = runtime_for(spark_config, "bench")
    t0 = time.perf_counter()
    runtime.pool.submit(runtime.ensure).result()
    print(f"cold SparkSession start: {time.perf_counter() - t0:.1f} s")
    schema = table_schema(DeclaredTable("shop", "orders", COLUMNS), "turso")
    specs = (
        ProcessorSpec("filter", "spec.processors[0]", ("orders",), expr=str(FILTER["expr"])),
        ProcessorSpec("mask", "spec.processors[1]", columns=(("email", "hash"),)),
    )
    plan = Plan(specs, [schema])
    runtime.pool.submit(plan.analyse, runtime).result()
    print(
        f"per-batch transform latency (filter + mask), after {warmup} warm-up batches (JVM JIT), serve's GC settings:"
    )
    figures = []
    for size in sizes:
        events = [event(s) for s in range(size)]
        for _ in range(warmup):
            runtime.pool.submit(plan.run, runtime, events).result()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            out = runtime.pool.submit(plan.run, runtime, events).result()
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        p99 = percentile(times, 99)
        print(f"  {size:>6} events: p50 {statistics.median(times):6.1f} ms  p99 {p99:6.1f} ms  "
              f"max {times[-1]:6.1f} ms ({len(out.events)} kept)")  # fmt: skip
        group = "Spark processors (filter + mask)"
        note = f"{runs} runs after {warmup} warm-up batches, max {times[-1]:.0f} ms"
        figures.append(
            Figure(group, f"{size:,}-event batch, p50", round(statistics.median(times), 1), "ms", note)
        )
        figures.append(Figure(group, f"{size:,}-event batch, p99", round(p99, 1), "ms", note,
                              "≤ 100 ms" if size == 10_000 else ""))  # fmt: skip
    return figures


async def throughput(total: int, master: str) -> None:
    gctune.tune()
    print(f"pipeline drain, {total} events, synthetic source -> file sink (no fsync), same run:")
    with tempfile.TemporaryDirectory() as tmp:
        for size in (2000, 10_000):
            # The no-processor rate moves +-20 % between runs on this machine: it is measured
            # before and after the runs with processors, and they are compared with the mean.
            plain = [await drain(pipeline(Path(tmp) / f"plain{size}a.jsonl", [], 1, size), total)]
            rates = {}
            for inflight in (1, 2, 4):
                out = Path(tmp) / f"f{inflight}-{size}.jsonl"
                rates[inflight] = await drain(pipeline(out, [FILTER, MASK], inflight, size, master), total)
            plain.append(await drain(pipeline(Path(tmp) / f"plain{size}b.jsonl", [], 1, size), total))
            base = statistics.mean(plain)
            print(f"  max_events {size:>6}, no processors:          {base:>9,.0f} events/s  "
                  f"(before {plain[0]:,.0f}, after {plain[1]:,.0f})")  # fmt: skip
            for inflight, rate in rates.items():
                print(f"  max_events {size:>6}, filter+mask, inflight {inflight}: "
                      f"{rate:>9,.0f} events/s  ({rate / base:.0%})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args()
    dflogging.configure(level="warning")  # restarts and failures still show
    print(f"{dt.datetime.now():%Y-%m-%d %H:%M}")
    latency(SparkConfig(master=args.master), args.runs, args.warmup)
    asyncio.run(throughput(args.events, args.master))


if __name__ == "__main__":
    main()
