"""Drain a MariaDB binlog backlog: pipeline (→ file sink) vs bare python-mysql-replication.

    python benchmarks/mysql_backlog.py [--rows 200000] [--table narrow|wide|both]

Starts a private MariaDB (tests/servers), writes the backlog, then in the same run
measures (1) bare mysql-replication reading every row of the backlog and (2) the
whole deltaforge pipeline delivering it to a JSONL file with checkpoints. The ratio
is the figure that matters; absolute rates depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

from benchmarks.drain import drain_rate
from tests.servers.mariadb import MariaDB

NARROW = "CREATE TABLE bench.narrow (id INT PRIMARY KEY, a INT, b VARCHAR(20))"
WIDE = (
    "CREATE TABLE bench.wide (id INT PRIMARY KEY, "
    + ", ".join(
        f"c{i} {t}"
        for i, t in enumerate(
            ["INT", "BIGINT", "VARCHAR(64)", "DECIMAL(12,2)", "DOUBLE", "DATETIME(3)", "DATE", "TEXT", "TINYINT",
             "VARCHAR(32)", "INT", "DOUBLE", "VARCHAR(64)", "BIGINT", "DECIMAL(10,4)", "DATETIME", "VARCHAR(16)",
             "INT", "TEXT"]
        )
    )
    + ")"
)  # fmt: skip


def fill(server: MariaDB, table: str, rows: int) -> None:
    with server.root() as c, c.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS bench")
        cur.execute(NARROW if table == "narrow" else WIDE)
        for start in range(0, rows, 1000):
            ids = range(start + 1, min(start + 1000, rows) + 1)
            if table == "narrow":
                values = ",".join(f"({i},{i * 7},'row-{i}')" for i in ids)
            else:
                values = ",".join(
                    f"({i},{i},{i * 1000},'name-{i}',{i}.25,{i}.5,'2024-01-02 03:04:05.678','2024-01-02',"
                    f"'text {i}',{i % 100},'s{i}',{i},{i}.125,'v{i}',{i},{i}.0001,'2024-05-06 07:08:09','x',{i},'t')"
                    for i in ids
                )
            cur.execute(f"INSERT INTO bench.{table} VALUES {values}")


def bare(server: MariaDB, rows: int) -> float:
    stream = BinLogStreamReader(
        connection_settings={
            "host": "127.0.0.1",
            "port": server.port,
            "user": "cdc",
            "password": "cdc-secret-pw",
        },
        server_id=4242,
        blocking=True,
        is_mariadb=True,
        auto_position="",
        only_events=[WriteRowsEvent],
    )
    t0 = time.perf_counter()
    n = 0
    for ev in stream:
        n += len(ev.rows)
        if n >= rows:
            break
    elapsed = time.perf_counter() - t0
    stream.close()
    return n / elapsed


async def pipeline(server: MariaDB, table: str, rows: int, out: Path) -> float:
    return await drain_rate(
        pipeline_doc(server, table, {"type": "file", "config": {"id": "f", "path": str(out)}}), rows
    )


def pipeline_doc(server: MariaDB, table: str, sink: dict[str, Any]) -> dict[str, Any]:
    """The pipeline from the backlog of ``bench.table`` to ``sink``."""
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "bench"},
        "spec": {
            "source": {
                "type": "mysql",
                "config": {"id": "b", "dsn": server.dsn(), "tables": [f"bench.{table}"]},
            },
            "sinks": [sink],
            "batch": {"max_events": 4000, "max_ms": 50},
        },
    }


def main() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--table", choices=["narrow", "wide", "both"], default="both")
    args = ap.parse_args()
    tables = ["narrow", "wide"] if args.table == "both" else [args.table]
    for table in tables:
        with MariaDB() as server, tempfile.TemporaryDirectory() as tmp:
            fill(server, table, args.rows)
            lib = bare(server, args.rows)
            pipe = asyncio.run(pipeline(server, table, args.rows, Path(tmp) / "events.jsonl"))
            print(
                f"{table:>6} table, {args.rows:,} rows: pipeline {pipe:>9,.0f} events/s | "
                f"bare mysql-replication {lib:>9,.0f} rows/s | ratio {pipe / lib:.0%}"
            )


if __name__ == "__main__":
    main()
