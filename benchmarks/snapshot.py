"""Snapshot a table: the pipeline (chunks between watermarks → file sink) vs a bare SELECT.

    python benchmarks/snapshot.py [--rows 1000000] [--chunk 10000] [--server postgres|mariadb|both]
    python benchmarks/snapshot.py --floor   # PostgreSQL: the per-row floor, see postgres_floor

Starts private servers (tests/servers), fills ``items(id, v, payload)``, then in the same run
measures (1) one bare ``SELECT *`` of the table with the same driver the snapshot uses
(asyncpg, aiomysql), rows fetched into Python, and (2) the whole pipeline taking an initial
snapshot and delivering every row to a JSONL file with checkpoints. The ratio is the figure
(the issue's target: at least 50 %); absolute rates depend on the machine.

Both run with ``serve``'s garbage-collector settings (:func:`deltaforge.gctune.tune`), the
bare read too: under Python's defaults the collector runs over the growing list of a million
records again and again, and the bare read of PostgreSQL slows to a third. It used to be read
so when this script ran alone, and tuned inside ``python -m benchmarks``, whose first benchmark
had tuned the process: two ratios for one pipeline (docs/performance.md, 6 Dec).
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

import aiomysql
import asyncpg
import orjson
import structlog

from benchmarks.drain import drain_rate
from deltaforge import gctune
from deltaforge.sources.postgres.values import SESSION
from tests.servers.mariadb import CDC_USER, MariaDB
from tests.servers.postgres import Postgres


def sink_doc(out: Path) -> list[dict[str, Any]]:
    return [{"type": "file", "config": {"id": "f", "path": str(out)}}]


async def postgres_items(pg: Postgres, rows: int) -> asyncpg.Connection:
    """``items`` filled with ``rows`` rows; a connection with the snapshot's session settings."""
    conn = await asyncpg.connect(pg.dsn())
    await conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint, payload text)")
    await conn.execute(
        "INSERT INTO items SELECT g, g, repeat('x', 40) FROM generate_series(1, $1::int) g", rows
    )
    await conn.execute("ANALYZE items")
    await conn.close()
    return await asyncpg.connect(pg.dsn(), server_settings=SESSION)


async def bare_select(conn: asyncpg.Connection) -> float:
    """Rows/s of one ``SELECT *`` of ``items`` fetched into Python, as the pipeline runs (the module)."""
    gctune.tune()
    t0 = time.perf_counter()
    got = len(await conn.fetch("SELECT * FROM items"))
    return got / (time.perf_counter() - t0)


async def postgres(rows: int, chunk: int, out: Path) -> tuple[float, float]:
    with Postgres() as pg:
        conn = await postgres_items(pg, rows)
        bare = await bare_select(conn)
        await conn.close()
        source = {"id": "b", "dsn": pg.dsn(), "slot": "bench", "publication": "bench", "tables": ["public.items"],
                  "snapshot": {"mode": "initial", "chunk_size": chunk}}  # fmt: skip
        pipe = await drain_rate(
            _doc("postgres", source, out), rows, done=lambda st: st.sinks["f"].events >= rows
        )
        return bare, pipe


async def mariadb(rows: int, chunk: int, out: Path) -> tuple[float, float]:
    with MariaDB() as my:
        with my.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
        with my.root("bench") as c, c.cursor() as cur:
            cur.execute(f"GRANT CREATE, INSERT, UPDATE ON bench.* TO '{CDC_USER}'@'%'")
            cur.execute("CREATE TABLE bench.items (id bigint PRIMARY KEY, v bigint, payload varchar(64))")
            cur.execute(f"INSERT INTO bench.items SELECT seq, seq, repeat('x', 40) FROM seq_1_to_{rows}")
            cur.execute("ANALYZE TABLE bench.items")
        conn = await aiomysql.connect(host="127.0.0.1", port=my.port, user="root", password="", db="bench")
        gctune.tune()  # as the pipeline runs (the module)
        t0 = time.perf_counter()
        async with conn.cursor(aiomysql.DictCursor) as cur:
            await cur.execute("SELECT * FROM items")
            got = len(await cur.fetchall())
        bare = got / (time.perf_counter() - t0)
        conn.close()
        source = {"id": "b", "dsn": my.dsn("bench"), "tables": ["bench.items"],
                  "snapshot": {"mode": "initial", "chunk_size": chunk}}  # fmt: skip
        pipe = await drain_rate(
            _doc("mysql", source, out), rows, done=lambda st: st.sinks["f"].events >= rows
        )
        return bare, pipe


async def postgres_floor(rows: int, chunk: int) -> list[tuple[float, float, float]]:
    """What no per-row design beats: the table read in the snapshot's keyset chunks and each row
    made into a native JSON line with nothing else (no events, batches, checkpoints or writes):
    the envelope's fixed bytes around the row's JSON and its event id, as the file sink's template
    makes them (deltaforge/envelopes.py). And the rows' JSON made by the server instead: each
    chunk's ``row_to_json`` texts joined into one, split into lines here. Three rounds, each after
    a bare SELECT: (bare, floor, server-made JSON)."""
    with Postgres() as pg:
        conn = await postgres_items(pg, rows)
        head, mid, key = (
            b'{"op":"r","before":null,"after":',
            b',"source":{"connector":"postgres","db":"bench","schema":"public","table":"items",'
            b'"ts_ms":1,"lsn":"0/0"},"tx":{"id":"snapshot:1","end":false},"event_id":"',
            b'","idempotency_key":"default|bench.items|snapshot:1|',
        )
        tail, dumps, out = b'","ts_ms":1}\n', orjson.dumps, []
        for _ in range(3):
            bare = await bare_select(conn)
            t0, last = time.perf_counter(), 0
            while records := await conn.fetch(
                "SELECT * FROM items WHERE id > $1 ORDER BY id LIMIT $2", last, chunk
            ):
                lines = []
                for r in records:
                    i = f"r{r[0]}".encode()
                    lines.append(b"".join((head, dumps(dict(r.items())), mid, i, key, i, tail)))
                b"".join(lines)
                last = records[-1][0]
            floor = rows / (time.perf_counter() - t0)
            t0, last = time.perf_counter(), 0
            while (got := await conn.fetchrow(SERVER_JSON, last, chunk))[0] is not None:
                got[0].split("\n")
                last = got[1]
            out.append((bare, floor, rows / (time.perf_counter() - t0)))
        await conn.close()
        return out


SERVER_JSON = (
    "SELECT string_agg(row_to_json(t)::text, E'\\n' ORDER BY id), max(id) "
    "FROM (SELECT * FROM items WHERE id > $1 ORDER BY id LIMIT $2) t"
)


def _doc(kind: str, source: dict[str, Any], out: Path) -> dict[str, Any]:
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "bench"},
        "spec": {
            "source": {"type": kind, "config": source},
            "sinks": sink_doc(out),
            "batch": {"max_events": 10000, "max_ms": 50},
        },
    }


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=10_000, help="snapshot.chunk_size")
    ap.add_argument("--server", choices=["postgres", "mariadb", "both"], default="both")
    ap.add_argument(
        "--floor", action="store_true", help="PostgreSQL: chunks read and made into lines, nothing else"
    )
    args = ap.parse_args()
    if args.floor:
        for bare, floor, server in asyncio.run(postgres_floor(args.rows, args.chunk)):
            print(
                f"postgres floor {floor:>9,.0f} rows/s | bare SELECT {bare:>9,.0f} rows/s | ratio {floor / bare:.0%}"
                f" | JSON made by the server {server:>9,.0f} rows/s, {server / bare:.0%}"
            )
        return
    runs = {"postgres": postgres, "mariadb": mariadb}
    for name in ["postgres", "mariadb"] if args.server == "both" else [args.server]:
        with tempfile.TemporaryDirectory() as tmp:
            bare, pipe = asyncio.run(runs[name](args.rows, args.chunk, Path(tmp) / "events.jsonl"))
        print(
            f"{name:>8} {args.rows:,} rows, chunks of {args.chunk:,}: snapshot {pipe:>9,.0f} rows/s | "
            f"bare SELECT {bare:>9,.0f} rows/s | ratio {pipe / bare:.0%}"
        )


if __name__ == "__main__":
    main()
