"""PostgreSQL restored from a copy of its files (a disk snapshot) taken before the last changes serve
delivered. The server writes new transactions at WAL positions serve has passed: moving the slot to
the checkpoint stopped at the WAL's end without a word and the decoder skipped them as delivered.
serve halts with ``position lost: the server's WAL ends at … Re-snapshot required.``, /health 503.

The copy is taken with the server stopped (what a disk snapshot of a crashed machine holds, once
recovered), and serve's proxy is down from the restore until the new transactions are written, so
it meets the restored server only then."""

from __future__ import annotations

import psycopg

from chaos.runner import RunContext
from chaos.scenarios.rig import Rig, halts_saying, postgres_rig, wait_for
from deltaforge.sources.postgres.pgoutput import parse_lsn


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        serve = rig.start()
        for _ in range(20):
            rig.workload.transaction()
        wait_for(lambda: len(rig.delivered()) == len(rig.workload.committed), 60, "every change delivered")
        rig.pg.halt()  # serve is degraded meanwhile, and reconnects by itself
        copy = rig.pg.copy_files()
        rig.pg.resume()
        _insert(rig.pg.dsn(), range(10_000, 10_040))
        with psycopg.connect(rig.pg.dsn(), autocommit=True) as conn:
            written = parse_lsn(str(conn.execute("SELECT pg_current_wal_lsn()::text").fetchall()[0][0]))
        wait_for(lambda: _checkpoint_lsn(rig) >= written, 60, "the changes after the copy checkpointed")
        rig.source_proxy.disable()
        rig.pg.halt()
        rig.pg.restore_files(copy)
        rig.pg.resume()
        _insert(rig.pg.dsn(), range(20_000, 20_003))  # positions serve has passed
        rig.source_proxy.enable()
        reasons = halts_saying(ctx, serve, "before the checkpoint", "Re-snapshot required.")
        ctx.figures["reason"] = reasons[reasons.find("the server's WAL") :][:120]


def _insert(dsn: str, keys: range) -> None:
    """One transaction per key (the workload's connection did not outlive the server's restart)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for key in keys:
            conn.execute("INSERT INTO items (id, ver, payload) VALUES (%s, 1, 'after')", (key,))


def _checkpoint_lsn(rig: Rig) -> int:
    """The file sink's stored checkpoint (heartbeats move it to the WAL's end when idle)."""
    assert rig.serve is not None
    stored = rig.serve.get("/pipelines/chaos/checkpoints").json().get("file")
    return int(stored["position"]["lsn"]) if stored else 0
