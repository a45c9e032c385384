"""Drain a PostgreSQL backlog: pipeline (→ file sink) vs a bare stream + pgoutput decode.

    python benchmarks/postgres_backlog.py [--rows 200000] [--tx 1000]

Starts a private PostgreSQL (tests/servers), creates two slots, writes the
backlog, then in the same run measures (1) the bare read: the slot streamed over
the replication protocol (libpq through psycopg, as the source does) and each
message decoded with deltaforge's pgoutput decoder, and (2) the whole pipeline
delivering the backlog to a JSONL file with checkpoints. The ratio is the figure;
absolute rates depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import structlog

from benchmarks.drain import drain_rate
from deltaforge.sources.postgres.pgoutput import Change, decode
from deltaforge.sources.postgres.replication import LogicalStream
from deltaforge.sources.postgres.values import SESSION
from tests.servers.postgres import Postgres


async def fill(pg: Postgres, rows: int, tx: int, slots: tuple[str, ...] = ("bare", "pipe")) -> None:
    """``rows`` in transactions of ``tx``, kept by each of ``slots`` (each reader drains its own)."""
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute("CREATE TABLE narrow (id int PRIMARY KEY, a int, b text)")
    await conn.execute("CREATE PUBLICATION bench FOR TABLE narrow")
    for slot in slots:
        await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
    for start in range(0, rows, tx):
        await conn.execute(
            "INSERT INTO narrow SELECT g, g * 7, 'row-' || g FROM generate_series($1::int, $2::int) g",
            start + 1,
            min(start + tx, rows),
        )
    await conn.close()


def bare(pg: Postgres, rows: int, slot: str = "bare") -> float:
    """Changes/s of the slot streamed and decoded, nothing else (blocking, as in the decoder)."""
    t0 = time.perf_counter()
    stream = LogicalStream(pg.dsn(), SESSION)
    stream.start(slot, "bench", 0)
    n = 0
    while n < rows:
        for lsn, data in stream.read(5000, 5.0):
            if isinstance(decode(data, lsn), Change):
                n += 1
    elapsed = time.perf_counter() - t0
    stream.close()
    return n / elapsed


async def pipeline(pg: Postgres, rows: int, out: Path, chunk: int) -> float:
    return await drain_rate(
        pipeline_doc(pg, "pipe", {"type": "file", "config": {"id": "f", "path": str(out)}}), rows
    )


def pipeline_doc(pg: Postgres, slot: str, sink: dict[str, Any]) -> dict[str, Any]:
    """The pipeline from ``slot`` of the backlog to ``sink``."""
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "bench"},
        "spec": {
            "source": {
                "type": "postgres",
                "config": {
                    "id": "b",
                    "dsn": pg.dsn(),
                    "slot": slot,
                    "publication": "bench",
                    "create": False,
                },
            },
            "sinks": [sink],
            "batch": {"max_events": 4000, "max_ms": 50},
        },
    }


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--tx", type=int, default=1000, help="rows per source transaction")
    ap.add_argument(
        "--chunk", type=int, default=5000, help="the source's read_chunk (pgoutput messages decoded per read)"
    )
    args = ap.parse_args()
    with Postgres() as pg, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(fill(pg, args.rows, args.tx))
        raw = bare(pg, args.rows)
        pipe = asyncio.run(pipeline(pg, args.rows, Path(tmp) / "events.jsonl", args.chunk))
    print(
        f"{args.rows:,} rows in transactions of {args.tx}: pipeline {pipe:>9,.0f} events/s | "
        f"bare stream+decode {raw:>9,.0f} changes/s | ratio {pipe / raw:.0%}"
    )


if __name__ == "__main__":
    main()
