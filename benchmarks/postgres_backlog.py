"""Drain a PostgreSQL backlog: pipeline (→ file sink) vs bare peek + pgoutput decode.

    python benchmarks/postgres_backlog.py [--rows 200000] [--tx 1000]

Starts a private PostgreSQL (tests/servers), creates two slots, writes the
backlog, then in the same run measures (1) bare SQL-level decoding: peek pages
of changes, decode them with deltaforge's pgoutput decoder and advance the slot,
and (2) the whole pipeline delivering the backlog to a JSONL file with
checkpoints. The ratio is the figure; absolute rates depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import structlog
from drain import drain_rate

from deltaforge.sources.postgres.pgoutput import Change, Commit, decode
from tests.servers.postgres import Postgres


async def fill(pg: Postgres, rows: int, tx: int) -> None:
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute("CREATE TABLE narrow (id int PRIMARY KEY, a int, b text)")
    await conn.execute("CREATE PUBLICATION bench FOR TABLE narrow")
    for slot in ("bare", "pipe"):
        await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
    for start in range(0, rows, tx):
        await conn.execute(
            "INSERT INTO narrow SELECT g, g * 7, 'row-' || g FROM generate_series($1::int, $2::int) g",
            start + 1,
            min(start + tx, rows),
        )
    await conn.close()


async def bare(pg: Postgres, rows: int) -> float:
    conn = await asyncpg.connect(pg.dsn())
    t0 = time.perf_counter()
    n = 0
    while n < rows:
        page = await conn.fetch(
            "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes('bare', NULL, 5000, "
            "'proto_version', '1', 'publication_names', 'bench')"
        )
        end = 0
        for lsn, data in page:
            msg = decode(data, lsn)
            if isinstance(msg, Change):
                n += 1
            elif isinstance(msg, Commit):
                end = msg.end_lsn
        await conn.execute("SELECT pg_replication_slot_advance('bare', $1)", end)
    elapsed = time.perf_counter() - t0
    await conn.close()
    return n / elapsed


async def pipeline(pg: Postgres, rows: int, out: Path, chunk: int) -> float:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "bench"},
        "spec": {
            "source": {
                "type": "postgres",
                "config": {
                    "id": "b",
                    "dsn": pg.dsn(),
                    "slot": "pipe",
                    "publication": "bench",
                    "create": False,
                },
            },
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}],
            "batch": {"max_events": 4000, "max_ms": 50},
        },
    }
    return await drain_rate(doc, rows)


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--tx", type=int, default=1000, help="rows per source transaction")
    ap.add_argument("--chunk", type=int, default=5000, help="the source's read_chunk (changes per peek)")
    args = ap.parse_args()
    with Postgres() as pg, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(fill(pg, args.rows, args.tx))
        raw = asyncio.run(bare(pg, args.rows))
        pipe = asyncio.run(pipeline(pg, args.rows, Path(tmp) / "events.jsonl", args.chunk))
    print(
        f"{args.rows:,} rows in transactions of {args.tx}: pipeline {pipe:>9,.0f} events/s | "
        f"bare peek+decode {raw:>9,.0f} changes/s | ratio {pipe / raw:.0%}"
    )


if __name__ == "__main__":
    main()
