"""The rig most scenarios share: a private PostgreSQL behind a proxy, a seeded workload, sinks
(a file, and optionally Redis, a PostgreSQL target, Kafka, NATS — each behind its own proxy),
``serve`` as a separate process, and the final verification of every sink."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toxiproxy.proxy import Proxy

from chaos.harness import (
    Change,
    Workload,
    checks,
    file_changes,
    kafka_changes,
    lost_changes,
    mariadb_workload,
    nats_changes,
    port_of,
    postgres_workload,
    redis_changes,
)
from chaos.runner import Failed, RunContext
from tests.serve_proc import Serve, free_port
from tests.servers.mariadb import MariaDB
from tests.servers.nats import Nats, NatsCluster
from tests.servers.netns import Link
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu

PIPELINE = "chaos"


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Until ``cond`` holds; returns how long it took. Fails the scenario at ``timeout``."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise Failed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def halts_saying(ctx: RunContext, serve: Serve, *says: str, timeout: float = 120) -> str:
    """Until serve's /health answers 503; fails the scenario unless its reasons hold each of ``says``.
    Notes how long it took (``halted_after_s``); returns the reasons."""
    took = wait_for(lambda: serve.get("/health").status_code == 503, timeout, "/health 503")
    ctx.figures["halted_after_s"] = round(took, 1)
    reasons = " ".join(serve.get("/health").json().get("reasons", []))
    if not all(s in reasons for s in says):
        raise Failed(f"/health does not say why ({' / '.join(says)}): {reasons!r}")
    return reasons


def settle(
    read: Callable[[], list[Change]], want: set[Change], timeout: float, quiet: float = 15
) -> float | None:
    """Until the sink holds every change in ``want`` (returns how long that took), or it has held
    the same number of changes for ``quiet`` seconds, or ``timeout`` (returns None: the checks
    then say what is missing)."""
    start = last_change = time.monotonic()
    count = -1
    while time.monotonic() - start < timeout:
        got = read()
        if want <= set(got):
            return time.monotonic() - start
        if len(got) != count:
            count, last_change = len(got), time.monotonic()
        elif time.monotonic() - last_change > quiet:
            return None
        time.sleep(0.2)
    return None


@dataclass
class Sink:
    """A sink entry, how to read what it holds, and whether it promises each change once."""

    entry: dict[str, Any]
    read: Callable[[], list[Change]]
    exactly_once: bool = False
    proxy: Proxy | None = None
    server: Any = None
    """The sink's own server, for a scenario that stops it (its proxy is what serve reaches)."""


@dataclass
class Rig:
    ctx: RunContext
    pg: Postgres
    source_proxy: Proxy
    workload: Workload
    sinks: dict[str, Sink] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    serve: Serve | None = None
    mariadb: MariaDB | None = None
    """Set by :func:`mariadb_rig`: the source is this MariaDB's ``shop.items`` (behind
    ``source_proxy``), not the PostgreSQL (which still holds a PostgreSQL target, if added)."""
    direct: bool = False
    """``serve`` reaches the PostgreSQL source at its own address, not through ``source_proxy``
    (a server behind a link of :func:`postgres_rig`'s)."""

    @property
    def source_dsn(self) -> str:
        if self.direct:
            return self.pg.dsn()
        return f"postgresql://postgres@127.0.0.1:{port_of(self.source_proxy)}/postgres"

    def add_redis(self, exactly_once: bool = True) -> Sink:
        server = self.stack.enter_context(Redis())
        proxy = self.ctx.proxies.proxy("redis", f"127.0.0.1:{server.port}")
        entry = {"type": "redis", "config": {"id": "redis", "uri": f"redis://127.0.0.1:{port_of(proxy)}/0",
                                              "stream": "cdc", "exactly_once": exactly_once}}  # fmt: skip
        sink = Sink(entry, lambda: redis_changes(server.client(), "cdc"), exactly_once, proxy, server)
        self.sinks["redis"] = sink
        return sink

    def add_nats(self) -> Sink:
        """JetStream, deduplicated by Nats-Msg-Id: each change once within the window."""
        server = self.stack.enter_context(Nats())
        proxy = self.ctx.proxies.proxy("nats", f"127.0.0.1:{server.port}")
        entry = {"type": "nats", "config": {"id": "nats", "url": f"nats://127.0.0.1:{port_of(proxy)}",
                                             "subject": "cdc.items", "stream": "CDC"}}  # fmt: skip
        sink = Sink(entry, lambda: nats_changes(server.url(), "cdc.items", "CDC"), True, proxy)
        self.sinks["nats"] = sink
        return sink

    def add_nats_cluster(self) -> tuple[Sink, NatsCluster]:
        """JetStream on three clustered servers, the stream replicated on all three (R3); the
        sink is given every server's URL, no proxy (a scenario kills servers instead)."""
        cluster = self.stack.enter_context(NatsCluster())
        entry = {"type": "nats", "config": {"id": "nats", "url": cluster.urls(), "subject": "cdc.items",
                                             "stream": "CDC", "stream_replicas": 3, "ack_timeout_s": 3}}  # fmt: skip
        sink = Sink(entry, lambda: nats_changes(cluster.nodes[0].url(), "cdc.items", "CDC"), True)
        self.sinks["nats"] = sink
        return sink, cluster

    def add_kafka(self, exactly_once: bool = False, name: str = "kafka") -> Sink:
        """A one-partition topic on a Tansu of its own, which tells clients the proxy's address.
        With ``exactly_once`` the sink writes transactionally, but duplicates are not counted:
        Tansu 0.6 hands aborted records to read_committed consumers (see ENVIRONMENT.md)."""
        port = free_port()
        proxy = self.ctx.proxies.proxy(name, f"127.0.0.1:{port}")
        server = self.stack.enter_context(Tansu(port=port, advertise=port_of(proxy)))
        server.create_topic("cdc", partitions=1)
        entry = {"type": "kafka", "config": {"id": name, "brokers": f"127.0.0.1:{port_of(proxy)}",
                                              "topic": "cdc", "timeout_s": 10, "exactly_once": exactly_once}}  # fmt: skip
        sink = Sink(entry, lambda: kafka_changes(f"127.0.0.1:{port_of(proxy)}", "cdc"), False, proxy, server)
        self.sinks[name] = sink
        return sink

    def add_postgres_target(self) -> Sink:
        """An if_newer upsert into a second database of the same server, through its own proxy."""
        import psycopg

        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE target")
        with psycopg.connect(self.pg.dsn("target"), autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, ver int, payload text, _df_position text)")
        proxy = self.ctx.proxies.proxy("target", f"127.0.0.1:{self.pg.port}")
        dsn = f"postgresql://postgres@127.0.0.1:{port_of(proxy)}/target"
        entry = {"type": "postgres", "config": {"id": "target", "dsn": dsn, "upsert_strategy": "if_newer"}}

        def state() -> list[Change]:
            with psycopg.connect(self.pg.dsn("target")) as conn:
                rows = conn.execute("SELECT id, ver FROM items").fetchall()
            return [("row", int(i), int(v)) for i, v in rows]

        sink = Sink(entry, state, False, proxy)
        self.sinks["target"] = sink
        return sink

    def start(
        self,
        batch: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
        file: dict[str, Any] | None = None,
        opened: bool = True,
        **extra: Any,
    ) -> Serve:
        """Write the pipeline (``source``: more source settings; ``file``: more file sink settings;
        ``extra``: more of the spec) and start serve on it; with ``opened``, return once the
        source is open."""
        if self.mariadb is not None:
            dsn = self.mariadb.dsn("shop").replace(f":{self.mariadb.port}", f":{port_of(self.source_proxy)}")
            entry = {
                "type": "mysql",
                "config": {"id": "my", "dsn": dsn, "tables": ["shop.items"], **(source or {})},
            }
        else:
            entry = {
                "type": "postgres",
                "config": {
                    "id": "pg",
                    "dsn": self.source_dsn,
                    "slot": "chaos",
                    "publication": "chaos",
                    "heartbeat_ms": 1000,
                    **(source or {}),
                },
            }
        spec = {
            "source": entry,
            "sinks": [{"type": "file", "config": {"id": "file", "path": str(self.ctx.workdir / "events.jsonl"),
                                                  **(file or {})}},
                      *(s.entry for s in self.sinks.values())],
            "batch": batch or {"max_events": 200, "max_ms": 50},
            "storage": {"type": "sqlite", "path": str(self.ctx.workdir / "checkpoints.db")},
            **extra,
        }  # fmt: skip
        self.ctx.pipeline(PIPELINE, spec)
        serve = self.launch()
        if opened:  # no snapshot yet: rows written before that are not captured
            serve.wait_source_open(PIPELINE)
        return serve

    def launch(self, spawned: Callable[[Serve], None] | None = None) -> Serve:
        """Start serve with the pipeline written by :meth:`start`; returns once its API answers.
        ``spawned`` is called as soon as the process exists (long before it opens anything)."""
        cfg = self.ctx.workdir / f"{PIPELINE}.yaml"
        self.serve = Serve(
            self.ctx.workdir, "--config", str(cfg), "--log-file", str(self.ctx.workdir / "log.jsonl")
        )
        if spawned is not None:
            spawned(self.serve)
        self.serve.wait_api()
        return self.serve

    def restart(self) -> Serve:
        """SIGKILL serve and start it again with the same configuration."""
        assert self.serve is not None
        self.serve.kill()
        return self.launch()

    def health(self) -> dict[str, Any]:
        assert self.serve is not None
        body: dict[str, Any] = self.serve.get("/health").json()
        return body

    def degraded(self) -> bool:
        return bool(self.health().get("status") == "degraded")

    def final_rows(self) -> list[Change]:
        """The source's rows after every committed change: ("row", id, ver)."""
        return _final_rows(list(self.workload.committed))

    def delivered(self) -> list[Change]:
        return file_changes(self.ctx.workdir / "events.jsonl")

    def progress(self, more_than: int, timeout: float = 60) -> None:
        wait_for(
            lambda: len(self.delivered()) > more_than, timeout, f"more than {more_than} changes delivered"
        )

    def verify(self, recover_timeout: float = 120) -> None:
        """Stop the workload; every sink must end with every committed change, in order per key,
        each once where promised; serve recovers by itself and stops cleanly."""
        self.workload.stop()
        committed = list(self.workload.committed)
        want = set(committed)
        ctx = self.ctx
        ctx.figures["committed"] = len(committed)
        readers: dict[str, Sink] = {"file": Sink({}, self.delivered), **self.sinks}
        for name, sink in readers.items():
            if sink.entry.get("type") == "postgres":
                final = {(k, v) for _, k, v in _final_rows(committed)}

                def equal(s: Sink = sink, f: set[tuple[int, int]] = final) -> bool:
                    return {(k, v) for _, k, v in s.read()} == f

                equal_after = wait_for(equal, recover_timeout, f"the {name} sink to equal the source")
                ctx.figures[f"{name}_caught_up_s"] = round(equal_after, 1)
                continue

            took = settle(sink.read, want, recover_timeout)
            ctx.figures[f"{name}_caught_up_s"] = round(took, 1) if took is not None else "never"
            held = sink.read()
            found = checks(committed, held)
            if found["lost"]:
                ctx.figures[f"{name}: first lost"] = ", ".join(lost_changes(committed, held))
            ctx.expect(f"{name}: events lost", found["lost"], 0)
            ctx.expect(f"{name}: phantom events", found["phantoms"], 0)
            ctx.expect(f"{name}: per-key order violations", found["order_violations"], 0)
            if sink.exactly_once:
                ctx.expect(f"{name}: duplicates", found["duplicates"], 0)
        wait_for(lambda: self.health().get("status") == "ok", 60, "/health ok")
        assert self.serve is not None
        ctx.expect("serve exit code", self.serve.terminate(), 0)


def _final_rows(committed: list[Change]) -> list[Change]:
    rows: dict[int, int] = {}
    for op, key, ver in committed:
        if op == "d":
            rows.pop(key, None)
        else:
            rows[key] = ver
    return [("row", k, v) for k, v in rows.items()]


@contextlib.contextmanager
def _running(rig: Rig) -> Iterator[None]:
    """However a scenario ends: its workload stopped, serve killed if still running (when the
    scenario failed, asked first what it was waiting on: ``waiting_on`` in its log)."""
    try:
        yield
    except BaseException:
        if rig.serve is not None and rig.serve.proc.poll() is None:
            rig.serve.ask_waits()
        raise
    finally:
        rig.workload.stop_quietly()
        if rig.serve is not None and rig.serve.proc.poll() is None:
            rig.serve.kill()


@contextlib.contextmanager
def postgres_rig(ctx: RunContext, link: Link | None = None) -> Iterator[Rig]:
    """The rig with a private PostgreSQL as its source. With ``link``, the server lives on that
    link's far side and ``serve`` reaches it over the link, no proxy between (a scenario cuts the
    link); the workload writes over the server's unix socket, which no cut reaches."""
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(Postgres(link))
        proxy = ctx.proxies.proxy("postgres", f"{pg.host}:{pg.port}")
        writes = pg.dsn() if link is None else pg.local_dsn()
        rig = Rig(ctx, pg, proxy, postgres_workload(writes, ctx.seed), direct=link is not None)
        stack.enter_context(rig.stack)
        with _running(rig):
            yield rig


@contextlib.contextmanager
def mariadb_rig(ctx: RunContext) -> Iterator[Rig]:
    """The rig with a private MariaDB as its source (the seeded workload writes ``shop.items``)."""
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(Postgres())  # for a PostgreSQL target, as in the PostgreSQL rig
        db = stack.enter_context(MariaDB())
        with db.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
        proxy = ctx.proxies.proxy("mariadb", f"127.0.0.1:{db.port}")
        rig = Rig(ctx, pg, proxy, mariadb_workload(lambda: db.root("shop"), ctx.seed), mariadb=db)
        stack.enter_context(rig.stack)
        with _running(rig):
            yield rig


def seeded_rig(ctx: RunContext) -> tuple[str, contextlib.AbstractContextManager[Rig]]:
    """MariaDB or PostgreSQL as the source, chosen by the seed (``mysql`` or ``postgres``, also
    in the figures), and its rig."""
    kind = random.Random(ctx.seed).choice(["mysql", "postgres"])
    ctx.figures["source"] = kind
    return kind, mariadb_rig(ctx) if kind == "mysql" else postgres_rig(ctx)


@dataclass
class MariaDBToFile:
    """A private MariaDB behind a proxy with the workload's table, and ``serve``'s arguments for a
    pipeline from it to a file (checkpoints in SQLite): the stop-and-start MariaDB scenarios."""

    db: MariaDB
    workload: Workload
    args: tuple[str, ...]
    events: Path
    proxy: Proxy
    """The proxy ``serve`` reaches the server through (the workload does not use it)."""


def mariadb_to_file(ctx: RunContext, stack: contextlib.ExitStack) -> MariaDBToFile:
    db = stack.enter_context(MariaDB())
    with db.root() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE shop")
    proxy = ctx.proxies.proxy("mariadb", f"127.0.0.1:{db.port}")
    dsn = db.dsn("shop").replace(f":{db.port}", f":{port_of(proxy)}")
    events = ctx.workdir / "events.jsonl"
    cfg = ctx.pipeline(PIPELINE, {
        "source": {"type": "mysql", "config": {"id": "my", "dsn": dsn, "tables": ["shop.items"]}},
        "sinks": [{"type": "file", "config": {"id": "file", "path": str(events)}}],
        "storage": {"type": "sqlite", "path": str(ctx.workdir / "checkpoints.db")},
    })  # fmt: skip
    args = ("--config", str(cfg), "--log-file", str(ctx.workdir / "log.jsonl"))
    return MariaDBToFile(db, mariadb_workload(lambda: db.root("shop"), ctx.seed), args, events, proxy)
