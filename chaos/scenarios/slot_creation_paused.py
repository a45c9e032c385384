"""The PostgreSQL server paused (every process SIGSTOPped: the cgroup freezer behind ``docker
pause``) while ``serve``'s first opening creates its replication slot, which waits, as slot
creation does, for a transaction left open. The server's kernel answers TCP keepalive, so the
question's connection looks alive: before, the opening waited a day for it and the pipeline said
``starting``. Now the question is watched from another connection: the pipeline says
``degraded`` within ``query_timeout_s`` and the connect bound; once the server resumes, the next
opening ends the backend of the question given up (still making the slot, half made), makes the
slot itself once the transaction ends, and every change written after that is delivered."""

from __future__ import annotations

import psycopg

from chaos.runner import RunContext
from chaos.scenarios.rig import PIPELINE, postgres_rig, wait_for
from tests.servers.base import paused

QUERY_TIMEOUT_S = 5

_CREATING = (
    "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_create_logical_replication_slot%%' "
    "AND state = 'active' AND wait_event_type = 'Lock' AND pid <> %s"
)


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig, psycopg.connect(rig.pg.dsn(), autocommit=True) as look:

        def creating(besides: int = 0) -> int | None:
            row = look.execute(_CREATING, (besides,)).fetchone()
            return int(row[0]) if row else None

        with psycopg.connect(rig.pg.dsn()) as hold:
            hold.execute("SELECT pg_current_xact_id()")  # an xid, left open: the slot waits for it
            serve = rig.start(source={"query_timeout_s": QUERY_TIMEOUT_S}, opened=False)
            wait_for(
                lambda: creating() is not None, 60, "the slot's creation waiting on the open transaction"
            )
            first = creating()
            assert first is not None
            pid = rig.pg.server_pid()
            assert pid is not None
            with paused(pid):
                said = wait_for(rig.degraded, 90, "/health degraded (the server paused mid-opening)")
                ctx.figures["degraded_after_s"] = round(said, 1)
            again = wait_for(lambda: creating(first) is not None, 120, "the next opening making the slot")
            ctx.figures["reopened_after_s"] = round(again, 1)
            ctx.expect("the given-up backend ended", _gone(look, first), True)
            hold.commit()
        serve.wait_source_open(PIPELINE, 60)
        rig.workload.start()
        rig.progress(100)
        rig.verify()
        log = (ctx.workdir / "log.jsonl").read_text()
        ctx.expect("stale_walsender_ended logged", '"stale_walsender_ended"' in log, True)


def _gone(look: psycopg.Connection[tuple[int]], pid: int) -> bool:
    row = look.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == 0
