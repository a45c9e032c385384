"""Backlog drains, start-up included: MariaDB and PostgreSQL → file and → Kafka.

    python benchmarks/backlog.py [--rows 1000000] [--source mariadb|postgres|both]

One backlog per server, drained in the same run by: the bare library (python-mysql-replication;
the PostgreSQL slot streamed and decoded), the pipeline to a JSONL file, to Kafka (Tansu) in
the default idempotent mode, and to Kafka with ``exactly_once`` (five times each, alternating:
the best rate of each is kept; the overhead is the median of the five adjacent pairs').
Every pipeline starts with no checkpoint and is timed from its start until the last row is
committed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog

from benchmarks import Figure
from benchmarks import mysql_backlog as my
from benchmarks import postgres_backlog as pg
from benchmarks.drain import drain_rate
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.servers.tansu import Tansu

SINKS = ("file", "kafka", "kafka_eo")
PAIRS = 5
ORDER = ("file", *("kafka", "kafka_eo") * PAIRS)
"""Kafka's two modes alternate, five times each: the best rate of each is kept (the first
pipeline of a run pays the broker's warm-up). The machine's speed drifts within minutes by more
than the overhead measured, so the overhead is taken pair by pair, each mode against the other
run next to it, and the median pair is the figure. Five pairs, not three: one run's pairs
spread from 0.5 to 17.1 %, and a median of three moved from 6 to 15 % between runs with nothing
changed (docs/performance.md)."""


def sink(kind: str, run: str, tmp: Path, broker: Tansu) -> dict[str, Any]:
    if kind == "file":
        return {"type": "file", "config": {"id": "f", "path": str(tmp / f"{run}.jsonl")}}
    broker.create_topic(run)
    return {"type": "kafka", "config": {"id": run, "brokers": broker.bootstrap, "topic": run,
                                        "exactly_once": kind == "kafka_eo"}}  # fmt: skip


def drop(kind: str, run: str, broker: Tansu) -> None:
    """A Kafka run's topic deleted once drained: Tansu (memory storage) slowed as it held more,
    and the last runs measured the broker. 1M-row drains, 5 Dec, traced: the sixth drain ran at
    64-69k events/s against 107-128k for the others (the fifth, once, fell to about 40k after
    its first 750k); with each topic deleted after its run, none slowed (docs/performance.md)."""
    if kind != "file":
        broker.delete_topic(run)


def runs() -> list[tuple[str, str]]:
    """``(kind, run name)`` in ORDER; a run's name names its slot and topic."""
    return [(kind, f"{kind}_{i}") for i, kind in enumerate(ORDER)]


def figures(source: str, rows: int, bare: float, rates: dict[str, list[float]]) -> list[Figure]:
    """``rates``: each kind's drains, in ORDER."""
    group = f"{source} backlog, {rows:,} rows"
    lib = "python-mysql-replication" if source == "mariadb" else "stream + pgoutput decode"
    target = {"mariadb": "≥ 100k/s, ≥ 0.85 x bare", "postgres": "≥ 90k/s"}[source]
    out = [Figure(group, f"bare read ({lib})", bare, "rows/s")]
    for kind in SINKS:
        label = {"file": "→ file", "kafka": "→ Kafka", "kafka_eo": "→ Kafka exactly_once"}[kind]
        best = max(rates[kind])
        out.append(Figure(group, label, best, "events/s", f"{best / bare:.0%} of bare",
                          target if kind == "kafka" else ""))  # fmt: skip
    pairs = sorted(1 - eo / default for default, eo in zip(rates["kafka"], rates["kafka_eo"], strict=True))
    out.append(Figure(group, "Kafka exactly_once overhead", round(statistics.median(pairs) * 100, 1), "%",
                      f"median of {len(pairs)} adjacent pairs ({', '.join(f'{p:.1%}' for p in pairs)})",
                      "≤ 10 %"))  # fmt: skip
    return out


def mariadb(rows: int) -> list[Figure]:
    with MariaDB() as server, Tansu() as broker, tempfile.TemporaryDirectory() as tmp:
        my.fill(server, "narrow", rows)
        bare = my.bare(server, rows)
        rates: dict[str, list[float]] = {}
        for kind, run in runs():
            rate = asyncio.run(
                drain_rate(my.pipeline_doc(server, "narrow", sink(kind, run, Path(tmp), broker)), rows)
            )
            rates.setdefault(kind, []).append(rate)
            drop(kind, run, broker)
    return figures("mariadb", rows, bare, rates)


def postgres(rows: int) -> list[Figure]:
    with Postgres() as server, Tansu() as broker, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(pg.fill(server, rows, 1000, ("bare", *(run for _, run in runs()))))
        bare = pg.bare(server, rows)
        rates: dict[str, list[float]] = {}
        for kind, run in runs():
            rate = asyncio.run(
                drain_rate(pg.pipeline_doc(server, run, sink(kind, run, Path(tmp), broker)), rows)
            )
            rates.setdefault(kind, []).append(rate)
            drop(kind, run, broker)
    return figures("postgres", rows, bare, rates)


RUNS: dict[str, Callable[[int], list[Figure]]] = {"mariadb": mariadb, "postgres": postgres}


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--source", choices=["mariadb", "postgres", "both"], default="both")
    args = ap.parse_args()
    for name in RUNS if args.source == "both" else [args.source]:
        for f in RUNS[name](args.rows):
            print(f"{f.group}: {f.name} {f.value:,.1f} {f.unit} {f.note}")


if __name__ == "__main__":
    main()
