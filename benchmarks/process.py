"""``serve`` as a process: peak memory through a backlog, and the first event after a restart.

    python benchmarks/process.py [--rows 1000000]

Peak RSS: serve (and its decoder child) drains a MariaDB backlog of ``rows`` and of a quarter
of it into a JSONL file; the resident memory of the process tree is sampled every 20 ms. Flat
means the larger backlog needs no more memory than the smaller one: full mailboxes hold the
reader back, whatever is waiting in the binlog.

First event after a restart: serve is stopped (SIGTERM), one row is committed, serve starts
again on its checkpoint; the time from starting the process to that row being in the file
(interpreter start-up and imports included), median of eleven restarts, with the quartiles.
Then the same to Kafka (Tansu), in the default mode and ``exactly_once``: to that row being read
by a consumer that polls the topic throughout, so the new producer's connection, metadata and
first acknowledgement (and for ``exactly_once`` its transactional id's initialisation and the
position record read back) are included. And the same from PostgreSQL to the file: its decoder
child (psycopg) and its checks differ from MariaDB's.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks import Figure
from benchmarks import mysql_backlog as my
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.servers.tansu import Tansu

RESTARTS = 11


TOPIC = "restart"


def spec(
    server: MariaDB, tmp: Path, broker: Tansu | None = None, exactly_once: bool = False
) -> dict[str, Any]:
    """To a JSONL file, or with ``broker`` to its topic ``restart``."""
    return pipeline_spec(mysql_source(server), tmp, broker, exactly_once)


def mysql_source(server: MariaDB) -> dict[str, Any]:
    return {"type": "mysql", "config": {"id": "my", "dsn": server.dsn(), "tables": ["bench.narrow"]}}


def pipeline_spec(
    source: dict[str, Any], tmp: Path, broker: Tansu | None = None, exactly_once: bool = False
) -> dict[str, Any]:
    sink: dict[str, Any] = {"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}
    if broker is not None:
        sink = {"type": "kafka", "config": {"id": "k", "brokers": broker.bootstrap, "topic": TOPIC,
                                            "exactly_once": exactly_once}}  # fmt: skip
    return {"source": source, "sinks": [sink], "storage": {"type": "sqlite", "path": str(tmp / "cp.db")}}


Insert = Callable[[int], None]
"""Commits one row of the restart table with this id."""


@contextlib.contextmanager
def database(kind: str) -> Iterator[tuple[dict[str, Any], Insert]]:
    """A private MariaDB (ten rows already in its binlog) or PostgreSQL: the source's spec, and
    how to commit a row."""
    if kind == "mariadb":
        with MariaDB() as server:
            my.fill(server, "narrow", 10)

            def insert_my(row: int) -> None:
                with server.root() as c, c.cursor() as cur:
                    cur.execute(f"INSERT INTO bench.narrow VALUES ({row}, 0, 'restart')")

            yield (
                mysql_source(server),
                insert_my,
            )
        return
    pg = Postgres().start()
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE narrow (id int PRIMARY KEY, v int, s text)")

        def insert_pg(row: int) -> None:
            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                conn.execute("INSERT INTO narrow VALUES (%s, 0, 'restart')", (row,))

        yield {"type": "postgres", "config": {"id": "pg", "dsn": pg.dsn(), "slot": "restart",
                                              "publication": "restart", "tables": ["public.narrow"]}}, insert_pg  # fmt: skip
    finally:
        pg.stop()


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


POLL_S = 0.002
"""How often the output is looked at: the figure's resolution."""


class InFile:
    """Whether a row is in the file sink's output yet (looked at every :data:`POLL_S`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, needle: bytes) -> bool:
        if self.path.exists() and needle in self.path.read_bytes():
            return True
        time.sleep(POLL_S)
        return False


class InTopic:
    """Whether a row has been read from the topic yet, by a consumer that polls it throughout
    (assigned to every partition from the start: no group rebalance in the way)."""

    def __init__(self, broker: Tansu) -> None:
        broker.create_topic(TOPIC)
        self.consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-restart",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 5})  # fmt: skip
        parts = self.consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        self.consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in parts])

    def __call__(self, needle: bytes) -> bool:
        # the row is committed just before serve starts: no record read earlier can be it
        msg = self.consumer.poll(POLL_S)
        return msg is not None and msg.error() is None and needle in (msg.value() or b"")


def first_event_after_restart(
    to_kafka: bool = False, exactly_once: bool = False, kind: str = "mariadb"
) -> list[float]:
    """Seconds from spawning serve to a row committed while it was down being in the file (or
    read from Kafka, written in the default mode or ``exactly_once``), one per restart, in
    ascending order; from MariaDB, or with ``kind="postgres"`` from PostgreSQL."""
    byte_compiled()
    times = []
    with (
        database(kind) as (source, insert),
        tempfile.TemporaryDirectory() as tmp_s,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_s)
        broker = stack.enter_context(Tansu()) if to_kafka else None
        with serve_pipeline(
            tmp, pipeline_spec(source, tmp, broker, exactly_once), name="bench"
        ) as first:  # writes its config
            first.wait_source_open("bench")  # PostgreSQL: the slot, from which the rows below are read
            for row in range(100, 110):
                insert(row)
            while committed(first) < 10:  # and a checkpoint to restart from
                time.sleep(0.05)
            first.terminate()
        arrived: InFile | InTopic = InFile(tmp / "events.jsonl")
        if broker is not None:
            arrived = InTopic(broker)
            stack.callback(arrived.consumer.close)  # before the broker stops
        cfg = tmp / "bench.yaml"
        for n in range(RESTARTS):
            row = 1_000_000 + n
            insert(row)
            needle = f'"id":{row},'.encode()
            t0 = time.perf_counter()
            # serve as users run it: the API on
            serve = Serve(tmp, "--config", str(cfg), "--log-file", str(tmp / "log.jsonl"))
            while not arrived(needle):
                if serve.proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {(tmp / 'serve.err').read_text()[-2000:]}")
            times.append(time.perf_counter() - t0)
            serve.terminate()
    return sorted(times)


def restart_figure(
    starts: list[float], to_kafka: bool, exactly_once: bool = False, kind: str = "mariadb"
) -> Figure:
    quartiles = statistics.quantiles(starts, n=4)
    return Figure(
        "serve as a process",
        f"first event after a restart{', to Kafka' if to_kafka else ''}{' exactly_once' if exactly_once else ''}"
        f"{', PostgreSQL' if kind == 'postgres' else ''}",
        round(statistics.median(starts) * 1000),
        "ms",
        f"process start to the row {'read from Kafka' if to_kafka else 'in the file'}, median of "
        f"{RESTARTS} (p25 {quartiles[0] * 1000:.0f}, p75 {quartiles[2] * 1000:.0f} ms)",
        "≤ 500 ms",
    )


def run(rows: int) -> list[Figure]:
    group = "serve as a process"
    small_peak, _ = peak_rss(rows // 4)
    peak, rate = peak_rss(rows)
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
        restart_figure(first_event_after_restart(), to_kafka=False),
        restart_figure(first_event_after_restart(to_kafka=True), to_kafka=True),
        restart_figure(
            first_event_after_restart(to_kafka=True, exactly_once=True), to_kafka=True, exactly_once=True
        ),
        restart_figure(first_event_after_restart(kind="postgres"), to_kafka=False, kind="postgres"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    for f in run(args.rows):
        print(f"{f.name}: {f.value:,} {f.unit} ({f.note})")


if __name__ == "__main__":
    main()
