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
    _restored(ctx, past=False)


def run_past(ctx: RunContext) -> None:
    """The same, but the restored server writes until its WAL reaches past serve's checkpoint before
    serve meets it: the WAL's end no longer shows the restore. The checkpoint's transaction does
    (its commit time, which the new transaction at that commit LSN does not share): halts
    ``position lost: the server's WAL at the checkpoint's transaction … holds …``."""
    _restored(ctx, past=True)


def run_idle(ctx: RunContext) -> None:
    """The copy is taken while serve idles, after it delivered everything: the copy holds every
    transaction serve read. The server's WAL then moves on in another database (none of it
    decoded), and serve's idle checkpoint with it. The restored server takes rows at positions
    before that checkpoint and its WAL passes it: neither the WAL's end nor the checkpoint's last
    transaction (the copy has it, with its time) shows the restore. The checkpoint is a quiet
    heartbeat, saying no transaction committed after that one before it: halts ``position lost: the
    server's WAL holds a transaction committed … between the last transaction deltaforge read …``."""
    with postgres_rig(ctx) as rig:
        serve = rig.start()
        for _ in range(20):
            rig.workload.transaction()
        wait_for(lambda: len(rig.delivered()) == len(rig.workload.committed), 60, "every change delivered")
        with psycopg.connect(rig.pg.dsn(), autocommit=True) as conn:
            idle = _wal_lsn(conn)
        wait_for(lambda: _checkpoint_lsn(rig) >= idle, 60, "serve's checkpoint at the idle WAL's end")
        rig.pg.halt()  # serve is degraded meanwhile, and reconnects by itself
        copy = rig.pg.copy_files()
        rig.pg.resume()
        with psycopg.connect(rig.pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE elsewhere")
        moved = _elsewhere(rig.pg.dsn("elsewhere"), idle + (1 << 20))
        wait_for(
            lambda: _checkpoint_lsn(rig) >= moved, 60, "serve's checkpoint past the other database's WAL"
        )
        rig.source_proxy.disable()
        held = _checkpoint_lsn(rig)
        rig.pg.halt()
        rig.pg.restore_files(copy)
        rig.pg.resume()
        _insert(rig.pg.dsn(), range(20_000, 20_003))  # positions serve has passed
        with psycopg.connect(rig.pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE elsewhere")  # the copy is older than it
        _elsewhere(rig.pg.dsn("elsewhere"), held + 1)
        ctx.figures["checkpoint_past_copy_bytes"] = held - idle
        rig.source_proxy.enable()
        reasons = halts_saying(
            ctx, serve, "between the last transaction deltaforge read", "Re-snapshot required."
        )
        ctx.figures["reason"] = reasons[reasons.find("the server's WAL") :][:160]


def _wal_lsn(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    return parse_lsn(str(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchall()[0][0]))


def _elsewhere(dsn: str, lsn: int) -> int:
    """Rows in another database until the server's WAL reaches ``lsn`` (the slot decodes none of
    them); where it ends."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS filler (id int, pad text)")
        while (now := _wal_lsn(conn)) < lsn:
            conn.execute("INSERT INTO filler SELECT g, repeat('p', 200) FROM generate_series(1, 500) g")
    return now


def _restored(ctx: RunContext, past: bool) -> None:
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
        held = _checkpoint_lsn(rig)  # serve cannot move it now: it cannot reach the server
        rig.pg.halt()
        rig.pg.restore_files(copy)
        rig.pg.resume()
        _insert(rig.pg.dsn(), range(20_000, 20_003))  # positions serve has passed
        if past:
            ctx.figures["written_after_restore"] = 3 + _insert_past(rig.pg.dsn(), held, 20_003)
        rig.source_proxy.enable()
        says = "at the checkpoint's transaction" if past else "before the checkpoint"
        reasons = halts_saying(ctx, serve, says, "Re-snapshot required.")
        ctx.figures["reason"] = reasons[reasons.find("the server's WAL") :][:160]


def _insert_past(dsn: str, lsn: int, first: int) -> int:
    """Transactions until the server's WAL reaches past ``lsn``; how many."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        key = first
        while _wal_lsn(conn) <= lsn:
            conn.execute("INSERT INTO items (id, ver, payload) VALUES (%s, 1, 'after')", (key,))
            key += 1
    return key - first


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
