"""A column is added mid-stream (ALTER TABLE … ADD COLUMN with a default) while rows are
written: changes before and after it all arrive, in order, and those after carry the column."""

from __future__ import annotations

import psycopg

from chaos.harness import file_changes
from chaos.runner import Failed, RunContext
from chaos.scenarios.rig import postgres_rig


def run(ctx: RunContext) -> None:
    with postgres_rig(ctx) as rig:
        rig.start()
        rig.workload.start()
        rig.progress(100)
        with psycopg.connect(rig.pg.dsn(), autocommit=True) as conn:
            conn.execute("ALTER TABLE items ADD COLUMN note text DEFAULT 'drift'")
        before = len(file_changes(ctx.workdir / "events.jsonl"))
        rig.progress(before + 200)
        rig.verify()
        import orjson

        lines = (ctx.workdir / "events.jsonl").read_bytes().splitlines()
        with_note = sum(1 for line in lines if b'"note"' in line and orjson.loads(line).get("after"))
        ctx.figures["events_with_new_column"] = with_note
        if not with_note:
            raise Failed("no event after the ALTER carries the new column")
