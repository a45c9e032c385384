"""Every benchmark in one run: ``python -m benchmarks [--quick] [--json PATH] [--only NAME ...]``.

Prints one table and writes the figures as JSON (``benchmarks/last-run.json`` unless told
otherwise; not committed). ``--quick`` runs the same measurements on small inputs, for CI:
figures printed, never asserted. Each benchmark starts its own private servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog
from rich.console import Console
from rich.table import Table

from benchmarks import Figure


def backlog(quick: bool) -> list[Figure]:
    from benchmarks import backlog as b

    rows = 20_000 if quick else 1_000_000
    return b.mariadb(rows) + b.postgres(rows)


def latency(quick: bool) -> list[Figure]:
    from benchmarks import latency as lat

    seconds = 3 if quick else 20
    out = []
    for kind in ("postgres", "mariadb"):
        r = lat.measure(kind, 5000, seconds)
        group = f"{kind} → Redis, commit to readable, 5,000 rows/s"
        note = f"{r['rows']:,} rows, {r['missing']} missing"
        out += [Figure(group, "p50", r["p50_ms"], "ms", note), Figure(group, "p95", r["p95_ms"], "ms", note),
                Figure(group, "p99", r["p99_ms"], "ms", note, "≤ 20 ms")]  # fmt: skip
    return out


def process(quick: bool) -> list[Figure]:
    from benchmarks import process as p

    return p.run(40_000 if quick else 1_000_000)


def spark(quick: bool) -> list[Figure]:
    from benchmarks import spark_transform as s
    from deltaforge.transform.spec import SparkConfig

    # 200 runs: of 50, the 99th percentile is the slowest batch
    return s.latency(SparkConfig(master="local[*]"), 5 if quick else 200, 20 if quick else 300, (10_000,))


def snapshot(quick: bool) -> list[Figure]:
    from benchmarks import snapshot as s

    rows = 20_000 if quick else 1_000_000
    out = []
    for name, run in (("postgres", s.postgres), ("mariadb", s.mariadb)):
        with tempfile.TemporaryDirectory() as tmp:
            bare, pipe = asyncio.run(run(rows, 10_000, Path(tmp) / "events.jsonl"))
        group = f"{name} snapshot, {rows:,} rows, chunks of 10,000"
        out += [Figure(group, "bare SELECT", round(bare), "rows/s"),
                Figure(group, "snapshot → file", round(pipe), "rows/s", f"{pipe / bare:.0%} of bare", "≥ 50 % of bare")]  # fmt: skip
    return out


BENCHMARKS: dict[str, Callable[[bool], list[Figure]]] = {
    "backlog": backlog,
    "latency": latency,
    "process": process,
    "snapshot": snapshot,
    "spark": spark,
}


def table(figures: list[Figure]) -> Table:
    t = Table(title="deltaforge benchmarks")
    for column in ("measure", "", "value", "compared with", "target"):
        t.add_column(column, justify="right" if column == "value" else "left")
    group = None
    for f in figures:
        value = f"{f.value:,.0f}" if f.value >= 100 else f"{f.value:,.1f}"
        t.add_row(f.group if f.group != group else "", f.name, f"{value} {f.unit}", f.note, f.target)
        group = f.group
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--quick", action="store_true", help="small inputs (CI): a smoke run, not figures to quote"
    )
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "last-run.json")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run just these")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    console = Console(width=None if sys.stdout.isatty() else 150)
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in args.only or BENCHMARKS:
        console.log(f"running {name}{' (quick)' if args.quick else ''}")
        got = BENCHMARKS[name](args.quick)
        figures += got
        for f in got:
            console.log(f"{f.group}: {f.name} {f.value:,} {f.unit}")
    console.print(table(figures))
    args.json.write_text(
        json.dumps(
            {
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "quick": args.quick,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "seconds": round(time.perf_counter() - started),
                "figures": [f.to_dict() for f in figures],
            },
            indent=2,
        )
    )
    console.log(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
