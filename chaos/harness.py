"""What every scenario needs: the proxy server, a workload that remembers what it committed,
independent readers of each sink, and the checks (lost, order, duplicates).

Servers are the test suite's private ones (``tests/servers``: started in temp dirs on free
ports, stopped by PID), so chaos runs from a checkout: ``python -m chaos ...``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
from toxiproxy import Toxiproxy
from toxiproxy.proxy import Proxy

from deltaforge.logrepeats import WINDOW_S, without_numbers
from tests.serve_proc import free_port

Change = tuple[str, int, int]
"""(op, id, ver) of one row change: what the workload committed, what a sink holds."""


class ProxyServer:
    """Toxiproxy: the one at ``$TOXIPROXY_URL`` when set (e.g. compose's, on the host network),
    else the real ``toxiproxy-server`` when on PATH, else ``python -m chaos proxy``."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        url = os.environ.get("TOXIPROXY_URL")
        if url:
            host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
            self.host, self.port, self.kind = host, int(port), f"toxiproxy at {url}"
        else:
            self.host, self.port = "127.0.0.1", free_port()
            real = shutil.which("toxiproxy-server")
            cmd = [real, "-port", str(self.port)] if real else [sys.executable, "-m", "chaos", "proxy",
                                                                 "--port", str(self.port)]  # fmt: skip
            self.kind = "toxiproxy-server" if real else "chaos proxy"
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://{self.host}:{self.port}/version", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                    raise RuntimeError(f"{self.kind} did not start") from None
                time.sleep(0.05)
        self.client = Toxiproxy()
        self.client.update_api_consumer(self.host, self.port)

    def proxy(self, name: str, upstream: str) -> Proxy:
        """A fresh proxy to ``upstream`` on a free port (any old one of that name is replaced)."""
        old = self.client.get_proxy(name)
        if old is not None:
            old.destroy()
        return self.client.create(upstream=upstream, name=name, listen=f"127.0.0.1:{free_port()}")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def port_of(proxy: Proxy) -> int:
    return int(proxy.listen.rsplit(":", 1)[1])


@dataclass
class Workload:
    """Transactions on ``items (id, ver, payload)``: inserts, updates (ver + 1) and deletes,
    seeded; ``committed`` holds every change whose COMMIT returned, in commit order."""

    execute: Callable[[list[tuple[str, tuple[Any, ...]]]], None]
    """Runs one transaction's statements (``%s`` placeholders) and commits."""
    seed: int
    committed: list[Change] = field(default_factory=list)
    live: dict[int, int] = field(default_factory=dict)
    next_id: int = 1
    failures: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one transaction at a time: the thread's, or a bulk one

    def bulk_insert(self, n: int, rows_sql: str) -> None:
        """One transaction inserting ``n`` new rows, alongside the workload's thread: ``rows_sql``
        selects ``(id, ver, payload)`` for the ids ``%s`` to ``%s`` (the database's series)."""
        with self._lock:
            first = self.next_id
            self.execute([(f"INSERT INTO items (id, ver, payload) {rows_sql}", (first, first + n - 1))])
            self.next_id += n
            self.live.update(dict.fromkeys(range(first, first + n), 1))
            self.committed.extend(("c", key, 1) for key in range(first, first + n))

    def transaction(self) -> None:
        with self._lock:
            self._transaction()

    def _transaction(self) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        changes: list[Change] = []
        live = dict(self.live)
        for _ in range(self.rng.randrange(1, 4)):
            roll = self.rng.random()
            if roll < 0.5 or not live:
                key, ver = self.next_id, 1
                self.next_id += 1
                statements.append(
                    ("INSERT INTO items (id, ver, payload) VALUES (%s, %s, %s)", (key, ver, "x" * 40))
                )
                changes.append(("c", key, ver))
                live[key] = ver
            elif roll < 0.85:
                key = self.rng.choice(list(live))
                live[key] += 1
                statements.append(("UPDATE items SET ver = %s WHERE id = %s", (live[key], key)))
                changes.append(("u", key, live[key]))
            else:
                key = self.rng.choice(list(live))
                statements.append(("DELETE FROM items WHERE id = %s", (key,)))
                changes.append(("d", key, live.pop(key)))
        self.execute(statements)
        self.live = live
        self.committed.extend(changes)

    def start(self, per_second: float = 100) -> None:
        def run() -> None:
            try:
                while not self._stop.is_set():
                    self.transaction()
                    self._stop.wait(1 / per_second)  # pacing of the workload, not synchronisation
            except BaseException as exc:  # noqa: BLE001 - the scenario reports it
                self.failures.append(exc)

        self._stop.clear()
        self._thread = threading.Thread(target=run, name="workload", daemon=True)
        self._thread.start()

    def stop_quietly(self) -> None:
        """Stop, whatever happened (cleanup after a failed scenario)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.failures:
            raise RuntimeError(f"the workload failed: {self.failures[0]!r}")


def postgres_workload(dsn: str, seed: int) -> Workload:
    import psycopg

    conn = psycopg.connect(dsn, autocommit=False)
    conn.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, ver int NOT NULL, payload text)")
    conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # deletes carry the version they removed
    conn.commit()

    def execute(statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with conn.transaction():
            for sql, args in statements:
                conn.execute(sql.encode(), args)

    conn.autocommit = True
    return Workload(execute, seed)


def mariadb_workload(root: Callable[[], Any], seed: int) -> Workload:
    conn = root()
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS items (id INT PRIMARY KEY, ver INT NOT NULL, payload TEXT)")

    def execute(statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        conn.ping(reconnect=True)  # a connection lost to a restart of the server is made again
        conn.begin()
        with conn.cursor() as cur:
            for sql, args in statements:
                cur.execute(sql, args)
        conn.commit()

    return Workload(execute, seed)


# -- what sinks hold, read independently -------------------------------------------------------


def change_of(doc: dict[str, Any]) -> Change | None:
    """A deltaforge event (native envelope) as (op, id, ver); None for other tables."""
    if doc.get("source", {}).get("table") != "items":
        return None
    op, before, after = doc["op"], doc.get("before"), doc.get("after")
    row = before if op == "d" else after
    if row is None:
        return None
    return (op, int(row["id"]), int(row["ver"]))


def file_changes(path: Path) -> list[Change]:
    """The file sink's changes; a last line still being written (no newline yet) is not one."""
    if not path.exists():
        return []
    data = path.read_bytes()
    out = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        if line.strip() and (c := change_of(orjson.loads(line))) is not None:
            out.append(c)
    return out


def redis_changes(client: Any, stream: str) -> list[Change]:
    return [c for _, f in client.xrange(stream) if (c := change_of(orjson.loads(f[b"event"]))) is not None]


def nats_changes(url: str, subject: str, stream: str, electing_s: float = 30.0) -> list[Change]:
    """Everything in a JetStream stream, read with a fresh pull consumer; read again while the
    cluster answers ``503`` (electing a stream or consumer leader: a server just killed or back,
    nats_leader_loss), for up to ``electing_s``."""
    import asyncio

    import nats

    async def read() -> list[Change]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            try:
                total = (await js.stream_info(stream)).state.messages
            except nats.js.errors.NotFoundError:
                return []
            sub = await js.pull_subscribe(subject, durable=f"chaos{time.monotonic_ns()}", stream=stream)
            out: list[Change] = []
            seen = 0
            while seen < total:
                try:
                    msgs = await sub.fetch(1000, timeout=2)
                except nats.errors.TimeoutError:
                    break
                for m in msgs:
                    seen += 1
                    if (c := change_of(orjson.loads(m.data))) is not None:
                        out.append(c)
                    await m.ack()
            return out
        finally:
            await nc.close()

    deadline = time.monotonic() + electing_s
    while True:
        try:
            return asyncio.run(read())
        except nats.js.errors.ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the election takes seconds; nothing to wait on but asking again


def kafka_changes(bootstrap: str, topic: str) -> list[Change]:
    """Every change in ``topic``, each partition read to its end. The end is where the consumer
    reports ``_PARTITION_EOF``, not the high watermark: Tansu 0.6 answers that as the last record
    batch's base offset + 1 (ENVIRONMENT.md), and a reader that stopped there left out the rest
    of that batch."""
    from confluent_kafka import Consumer, TopicPartition

    from deltaforge.sinks.base import RetryableSinkError
    from deltaforge.sinks.kafka_offsets import read_to_end

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "log_level": 3})  # fmt: skip
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or not meta.partitions:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        by_partition: dict[int, list[Change]] = {p: [] for p in meta.partitions}
        with contextlib.suppress(RetryableSinkError):  # not at the end in 60 s: what was read
            for msg in read_to_end(consumer, set(meta.partitions), 60):
                value = msg.value()
                if value is not None and (c := change_of(orjson.loads(value))) is not None:
                    by_partition[int(msg.partition() or 0)].append(c)
        return [c for p in sorted(by_partition) for c in by_partition[p]]
    finally:
        consumer.close()


# -- checks ----------------------------------------------------------------------------------------


def order_violations(delivered: Iterable[Change]) -> int:
    """Per key, the first time each change is seen must follow the commit order (a replay after a
    crash repeats a suffix: repeats are not violations)."""
    seen: set[Change] = set()
    last: dict[int, tuple[int, int]] = {}
    bad = 0
    rank = {"c": 0, "u": 1, "d": 2}
    for change in delivered:
        if change in seen:
            continue
        seen.add(change)
        op, key, ver = change
        mark = (ver, rank[op])
        if key in last and mark < last[key]:
            bad += 1
        last[key] = max(mark, last.get(key, mark))
    return bad


def lost_changes(committed: list[Change], delivered: list[Change], most: int = 10) -> list[str]:
    """The first ``most`` lost changes, each with its place in the commit order (``#n``), so a
    failed run says which ones: a run of neighbours points at one batch, scattered ones elsewhere."""
    got = set(delivered)
    return [
        f"#{i} {op} {key} v{ver}" for i, (op, key, ver) in enumerate(committed) if (op, key, ver) not in got
    ][:most]


def checks(committed: list[Change], delivered: list[Change]) -> dict[str, int]:
    """Events lost (committed, never delivered), phantoms (delivered, never committed), per-key
    order violations and duplicates (changes delivered more than once)."""
    got = Counter(delivered)
    want = set(committed)
    return {
        "lost": sum(1 for c in committed if c not in got),
        "phantoms": sum(1 for c in got if c not in want),
        "order_violations": order_violations(delivered),
        "duplicates": sum(n - 1 for n in got.values() if n > 1),
    }


def library_lines(log: Path) -> tuple[int, int]:
    """What one serve process's libraries said in its log (``library_error``/``library_warning``),
    and how many of those lines came within a minute of the last one of their kind logged
    before them while it ran: lines a library says again and again are logged once a minute
    (``logrepeats``). As serve ends it says the counts still held back, whenever their minute."""
    lines, repeats = 0, 0
    last: dict[tuple[str, str, str], datetime] = {}
    ending = False
    for raw in log.read_bytes().splitlines():
        doc = orjson.loads(raw)
        ending = ending or doc.get("event") == "shutdown_requested"
        if doc.get("event") not in ("library_error", "library_warning"):
            continue
        lines += 1
        if ending:
            continue
        kind = (str(doc.get("actor")), str(doc["level"]), without_numbers(str(doc.get("message"))))
        at = datetime.fromisoformat(doc["ts"])
        if kind in last and (at - last[kind]).total_seconds() < WINDOW_S:
            repeats += 1
        last[kind] = at
    return lines, repeats
