"""``serve`` as a process: peak memory through a backlog, and the first event after a restart.

    python benchmarks/process.py [--rows 1000000]

Peak RSS: serve (and its decoder child) drains a MariaDB backlog of ``rows`` and of a quarter
of it into a JSONL file; the resident memory of the process tree is sampled every 20 ms. Flat
means the larger backlog needs no more memory than the smaller one: full mailboxes hold the
reader back, whatever is waiting in the binlog.

First event after a restart: serve is stopped (SIGTERM), one row is committed, serve starts
again on its checkpoint; the time from starting the process to that row being in the file
(interpreter start-up and imports included), median of eleven restarts, with the quartiles.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from benchmarks import Figure
from benchmarks import mysql_backlog as my
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.mariadb import MariaDB

RESTARTS = 11


def spec(server: MariaDB, tmp: Path) -> dict[str, Any]:
    return {
        "source": {"type": "mysql", "config": {"id": "my", "dsn": server.dsn(), "tables": ["bench.narrow"]}},
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
        "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
    }


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def committed(serve: Serve) -> int:
    return int(serve.get("/pipelines/bench").json()["counters"]["events_committed"])


def peak_rss(rows: int) -> tuple[float, float]:
    """Peak RSS (MB) of serve's process tree draining ``rows``, and the drain rate (events/s)."""
    with MariaDB() as server, tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        my.fill(server, "narrow", rows)
        t0 = time.perf_counter()
        with serve_pipeline(tmp, spec(server, tmp), name="bench") as serve:
            proc = psutil.Process(serve.proc.pid)
            peak = 0
            polled = time.monotonic()
            done = 0
            while done < rows:
                peak = max(peak, tree_rss(proc))
                time.sleep(0.02)  # the sampling period
                if time.monotonic() - polled > 0.25:
                    done, polled = committed(serve), time.monotonic()
            elapsed = time.perf_counter() - t0
            serve.terminate()
    return peak / 2**20, rows / elapsed


def byte_compiled() -> None:
    """The project's modules compiled to bytecode, as installing a wheel leaves them.

    An editable install caches bytecode only when Python may write it: with
    PYTHONDONTWRITEBYTECODE set (as on the machine these figures come from), every start of
    serve compiled deltaforge's modules again, about 80 ms of CPU the figure then included.
    """
    root = Path(__file__).resolve().parent.parent
    for package in ("deltaforge", "actors", "supervision"):
        compileall.compile_dir(root / package, quiet=1)
    # and the dataclass methods serve compiles at start (deltaforge/codecache.py), which the
    # first start after an install keeps unless bytecode writing is off, as it is here
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import deltaforge.cli"], env=env, check=True)


def first_event_after_restart() -> list[float]:
    """Seconds from spawning serve to a row committed while it was down being in the file, one per
    restart, in ascending order."""
    byte_compiled()
    times = []
    with MariaDB() as server, tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        my.fill(server, "narrow", 10)
        out = tmp / "events.jsonl"
        with serve_pipeline(tmp, spec(server, tmp), name="bench") as first:  # writes its config
            while committed(first) < 10:  # and a checkpoint to restart from
                time.sleep(0.05)
            first.terminate()
        cfg = tmp / "bench.yaml"
        for n in range(RESTARTS):
            row = 1_000_000 + n
            with server.root() as c, c.cursor() as cur:
                cur.execute(f"INSERT INTO bench.narrow VALUES ({row}, 0, 'restart')")
            needle = f'"id":{row},'.encode()
            t0 = time.perf_counter()
            # serve as users run it: the API on
            serve = Serve(tmp, "--config", str(cfg), "--log-file", str(tmp / "log.jsonl"))
            while not out.exists() or needle not in out.read_bytes():
                if serve.proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {(tmp / 'serve.err').read_text()[-2000:]}")
                time.sleep(0.002)  # the polling period: the figure's resolution
            times.append(time.perf_counter() - t0)
            serve.terminate()
    return sorted(times)


def run(rows: int) -> list[Figure]:
    group = "serve as a process"
    small_peak, _ = peak_rss(rows // 4)
    peak, rate = peak_rss(rows)
    starts = first_event_after_restart()
    start = statistics.median(starts)
    quartiles = statistics.quantiles(starts, n=4)
    return [
        Figure(
            group,
            f"peak RSS draining {rows // 4:,} rows",
            round(small_peak, 1),
            "MB",
            "serve + decoder child",
        ),
        Figure(
            group,
            f"peak RSS draining {rows:,} rows",
            round(peak, 1),
            "MB",
            f"serve + decoder child, {rate:,.0f} events/s to a file",
            "≤ 200 MB, flat",
        ),
        Figure(
            group,
            "first event after a restart",
            round(start * 1000),
            "ms",
            f"process start to the row in the file, median of {RESTARTS} "
            f"(p25 {quartiles[0] * 1000:.0f}, p75 {quartiles[2] * 1000:.0f} ms)",
            "≤ 500 ms",
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    for f in run(args.rows):
        print(f"{f.name}: {f.value:,} {f.unit} ({f.note})")


if __name__ == "__main__":
    main()
