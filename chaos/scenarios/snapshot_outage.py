"""The source goes away in the middle of an initial snapshot (proxy disabled 8 s, then every
connection cut after 256 KB for 10 s) while a writer changes the table. Unavailable is not
crashed: degraded meanwhile; afterwards the snapshot goes on from the chunks every sink
holds (not from scratch), and the sink's replay equals the table, each key's last event its
newest version."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg

from chaos.harness import port_of
from chaos.runner import RunContext
from chaos.scenarios.rig import wait_for
from tests.helpers import stored_checkpoint
from tests.serve_proc import Serve
from tests.servers.postgres import Postgres
from tests.snapshot_kit import Writer, check_handoff, snapshot_rows_in

ROWS, CHUNK = 60_000, 2_000


def run(ctx: RunContext) -> None:
    with Postgres() as pg, contextlib.ExitStack() as stack:
        proxy = ctx.proxies.proxy("postgres", f"127.0.0.1:{pg.port}")
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL, payload text)")
            conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")
            conn.execute(
                "INSERT INTO items SELECT g, g, repeat('x', 40) FROM generate_series(1, %s) g", (ROWS,)
            )
        out = ctx.workdir / "events.jsonl"
        spec = {
            "source": {"type": "postgres", "config": {
                "id": "pg", "dsn": f"postgresql://postgres@127.0.0.1:{port_of(proxy)}/postgres", "slot": "chaos",
                "publication": "chaos", "tables": ["public.items"], "heartbeat_ms": 500,
                "snapshot": {"mode": "initial", "chunk_size": CHUNK}}},
            "sinks": [{"type": "file", "config": {"id": "file", "path": str(out)}}],
            "batch": {"max_events": 1000, "max_ms": 50},
            "storage": {"type": "sqlite", "path": str(ctx.workdir / "checkpoints.db")},
        }  # fmt: skip
        cfg = ctx.pipeline("chaos", spec)
        serve = Serve(ctx.workdir, "--config", str(cfg), "--log-file", str(ctx.workdir / "log.jsonl"))
        stack.callback(lambda: None if serve.proc.poll() is not None else serve.kill())
        serve.wait_api()

        def connect() -> tuple[Any, Any]:
            conn = psycopg.connect(pg.dsn(), autocommit=True)
            return (lambda sql, args: conn.execute(sql, args)), conn.close

        writer = Writer(connect, ROWS, seed=ctx.seed, rate=300)
        stack.callback(writer.stop.set)
        writer.start()
        wait_for(lambda: snapshot_rows_in(out) >= ROWS // 4, 120, "a quarter of the snapshot")
        proxy.disable()
        wait_for(lambda: serve.get("/health").json().get("status") == "degraded", 30, "/health degraded")
        time.sleep(8)  # the outage itself
        proxy.enable()
        proxy.add_toxic(type="limit_data", attributes={"bytes": 262144})
        time.sleep(10)  # a window of cuts
        proxy.destroy_toxic("limit_data_downstream")

        def done() -> bool:
            s = serve.get("/pipelines/chaos").json()["snapshot"]
            return not s["running"] and bool(s["finished"])

        ctx.figures["snapshot_s"] = round(wait_for(done, 180, "snapshot finished"), 1)
        writer.stop.set()
        writer.join(10)
        ctx.expect("writer errors", repr(writer.error) if writer.error else None, None)
        with psycopg.connect(pg.dsn()) as conn:
            (lsn,) = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone() or (0,)
            target = int(lsn)
            table = {int(i): int(v) for i, v in conn.execute("SELECT id, v FROM items").fetchall()}

        def caught_up() -> bool:
            cp = stored_checkpoint(ctx.workdir / "checkpoints.db", "pg::sink::file")
            return cp is not None and int(cp["lsn"]) >= target

        wait_for(caught_up, 120, "the sink caught up")
        ctx.expect("serve exit code", serve.terminate(), 0)
        try:
            rows = check_handoff(out, table, crashes=True)
            ctx.expect("replay equals the table, last events newest", True, True)
        except AssertionError as exc:
            ctx.expect("replay equals the table, last events newest", str(exc)[:300], True)
            return
        ctx.figures["snapshot_rows"] = rows
        ctx.figures["writes"] = dict(writer.ops)
        # Reconnects re-read the chunks not yet checkpointed, never the whole table again.
        ctx.expect(
            "snapshot restarted from scratch", rows > ROWS + sum(writer.ops.values()) + 20 * CHUNK, False
        )
