"""Steady-state latency from COMMIT returning to the row being readable in a Redis stream.

    python benchmarks/latency.py [--source postgres|mariadb|both] [--rate 5000] [--seconds 15]

Measured as a user would: ``serve`` runs as its own process on a pipeline from a private
PostgreSQL or MariaDB to a private Redis (its default persistence: no append-only file); a
writer process commits rows at a steady rate and notes the wall-clock time at which each
COMMIT returned; an independent consumer process reads the stream with ``XREAD BLOCK`` and
notes when each row arrived. The first second is warm-up and left out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from benchmarks import percentile
from tests.serve_proc import serve_pipeline
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis

ROWS_PER_COMMIT = 10
STREAM = "latency"
WARMUP_S = 1.0


class PlainRedis(Redis):
    """Redis as it ships: no append-only file, so the sink's latency is not an fsync's."""

    def command(self) -> list[str]:
        return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "no"]  # fmt: skip


def write(kind: str, dsn: str, rate: int, seconds: float, out: str) -> None:
    """Commit ``rate`` rows/s for ``seconds`` in commits of ROWS_PER_COMMIT; note each commit's return."""
    every = ROWS_PER_COMMIT / rate
    total = int(rate * seconds)
    stamps: list[float] = []
    if kind == "postgres":
        import psycopg

        conn: Any = psycopg.connect(dsn, autocommit=True)
        sql = "INSERT INTO lat (id, v) SELECT g, 'x' FROM generate_series(%s::int, %s::int) g"
    else:
        import pymysql

        conn = pymysql.connect(**json.loads(dsn), autocommit=True)
        sql = "INSERT INTO bench.lat (id, v) SELECT seq, 'x' FROM seq_{}_to_{}"
    cur = conn.cursor()
    t0 = time.monotonic()
    for k, first in enumerate(range(1, total + 1, ROWS_PER_COMMIT)):
        wait = t0 + k * every - time.monotonic()  # pacing by an absolute schedule: no drift
        if wait > 0:
            time.sleep(wait)
        last = min(first + ROWS_PER_COMMIT - 1, total)
        if kind == "postgres":
            cur.execute(sql, (first, last))
        else:
            cur.execute(sql.format(first, last))
        stamps.append(time.time())
    conn.close()
    Path(out).write_text(json.dumps(stamps))


def consume(port: int, total: int, out: str, timeout: float) -> None:
    """Read the stream until ``total`` rows came; note each row's arrival (wall clock)."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    seen: dict[int, float] = {}
    last = "0-0"
    deadline = time.monotonic() + timeout
    while len(seen) < total and time.monotonic() < deadline:
        got = client.xread({STREAM: last}, count=10_000, block=1000)
        now = time.time()
        for _, entries in got:
            for entry_id, fields in entries:
                last = entry_id
                doc = orjson.loads(fields[b"event"])
                after = doc.get("after") or doc.get("payload", {}).get("after")
                seen.setdefault(int(after["id"]), now)
    Path(out).write_text(json.dumps(seen))


def measure(kind: str, rate: int, seconds: float) -> dict[str, Any]:
    """Start the servers and serve, write and consume; latency percentiles in ms."""
    with tempfile.TemporaryDirectory() as tmp_s, PlainRedis() as redis_server:
        tmp = Path(tmp_s)
        if kind == "postgres":
            server: Any = Postgres().start()
            import psycopg

            with psycopg.connect(server.dsn(), autocommit=True) as c:
                c.execute("CREATE TABLE lat (id int PRIMARY KEY, v text)")
            source = {"type": "postgres", "config": {"id": "pg", "dsn": server.dsn(), "slot": "lat",
                                                     "publication": "lat", "tables": ["public.lat"]}}  # fmt: skip
            writer_dsn = server.dsn()
        else:
            server = MariaDB().start()
            with server.root() as c, c.cursor() as cur:
                cur.execute("CREATE DATABASE bench")
                cur.execute("CREATE TABLE bench.lat (id INT PRIMARY KEY, v VARCHAR(8))")
            source = {"type": "mysql", "config": {"id": "my", "dsn": server.dsn(), "tables": ["bench.lat"]}}
            writer_dsn = json.dumps(
                {
                    "host": "127.0.0.1",
                    "port": server.port,
                    "user": "root",
                    "password": "",
                    "database": "bench",
                }
            )
        try:
            spec = {
                "source": source,
                "sinks": [
                    {"type": "redis", "config": {"id": "r", "uri": redis_server.uri(), "stream": STREAM}}
                ],
                "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
            }
            total = int(rate * seconds)
            with serve_pipeline(tmp, spec, name="latency"):
                ctx = mp.get_context("spawn")
                consumer = ctx.Process(target=consume, args=(redis_server.port, total, str(tmp / "seen.json"),
                                                             seconds + 60))  # fmt: skip
                consumer.start()
                writer = ctx.Process(
                    target=write, args=(kind, writer_dsn, rate, seconds, str(tmp / "stamps.json"))
                )
                writer.start()
                writer.join()
                consumer.join()
            stamps: list[float] = json.loads((tmp / "stamps.json").read_text())
            seen = {int(k): v for k, v in json.loads((tmp / "seen.json").read_text()).items()}
        finally:
            server.stop()
    start = stamps[0]
    lat = sorted(
        (seen[i] - stamp) * 1000
        for k, stamp in enumerate(stamps)
        if stamp - start >= WARMUP_S
        for i in range(k * ROWS_PER_COMMIT + 1, (k + 1) * ROWS_PER_COMMIT + 1)
        if i in seen
    )
    missing = int(rate * seconds) - len(seen)
    return {
        "source": kind,
        "rate": rate,
        "rows": len(lat),
        "missing": missing,
        "p50_ms": round(statistics.median(lat), 1),
        "p95_ms": round(percentile(lat, 95), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "max_ms": round(lat[-1], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source", choices=["postgres", "mariadb", "both"], default="both")
    ap.add_argument("--rate", type=int, default=5000, help="rows committed per second")
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    for kind in ["postgres", "mariadb"] if args.source == "both" else [args.source]:
        r = measure(kind, args.rate, args.seconds)
        print(f"{kind:>8} → redis at {r['rate']:,} rows/s: p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, "
              f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms ({r['rows']:,} rows, {r['missing']} missing)")  # fmt: skip


if __name__ == "__main__":
    main()
