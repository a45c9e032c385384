"""PostgreSQL failover: the server's identity, and whether a checkpoint from the old primary can
be resumed on the new one (see ``deltaforge/pipeline/reconciler.py``).

A physical standby has the same ``system_identifier`` as its primary; promotion starts a new
timeline, so the identity is both. On a promoted standby the checkpoint is reachable when:

* the new timeline left the old one at or after the checkpoint (a standby that lagged behind
  the checkpoint lacks changes the old primary committed);
* the slot exists there (physical replication does not copy slots); and
* no captured table changed between the checkpoint and the slot's start, which that slot can
  never decode (checked in the WAL with ``pg_walinspect``).

The slot is then never advanced to the old checkpoint (that would discard the new primary's
commits in between): reading starts at the slot's own position.
"""

from __future__ import annotations

import asyncpg

from deltaforge.sources.base import PositionLost, Undeterminable
from deltaforge.sources.postgres.pgoutput import format_lsn, parse_lsn

IDENTITY = "SELECT system_identifier::text, pg_walfile_name(pg_current_wal_lsn()) FROM pg_control_system()"
HISTORY = "SELECT pg_read_file('pg_wal/' || lpad(upper(to_hex($1::int)), 8, '0') || '.history')"
CAPTURED_FILES = (
    "SELECT DISTINCT CASE WHEN c.reltablespace = 0 THEN (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default') "
    "ELSE c.reltablespace END, (SELECT oid FROM pg_database WHERE datname = current_database()), "
    "pg_relation_filenode(c.oid) FROM pg_publication_tables t "
    "JOIN pg_namespace n ON n.nspname = t.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "
    "WHERE t.pubname = $1"
)
CHANGES_BETWEEN = (
    "SELECT count(*) FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) "
    "WHERE resource_manager IN ('Heap', 'Heap2') AND block_ref LIKE ANY($3::text[])"
)


async def identity(conn: asyncpg.Connection) -> dict[str, str]:
    system_identifier, walfile = await conn.fetchrow(IDENTITY)
    return {"system_identifier": str(system_identifier), "timeline": str(int(str(walfile)[:8], 16))}


async def check_reachable(
    conn: asyncpg.Connection, slot: str, publication: str, checkpoint_lsn: int, previous: dict[str, str]
) -> None:
    """Raise PositionLost unless reading can resume after ``checkpoint_lsn`` on this (new) server."""
    now = await identity(conn)
    if now["system_identifier"] != previous.get("system_identifier"):
        raise PositionLost(
            f"the DSN now leads to another PostgreSQL cluster (system identifier {now['system_identifier']}, "
            f"was {previous.get('system_identifier')}): its positions are not comparable"
        )
    old_tl, new_tl = int(previous.get("timeline", "0")), int(now["timeline"])
    if new_tl != old_tl:
        switch = await _switch_point(conn, old_tl, new_tl)
        if checkpoint_lsn > switch:
            raise PositionLost(
                f"the new primary's history left timeline {old_tl} at {format_lsn(switch)}, before the "
                f"checkpoint {format_lsn(checkpoint_lsn)}: it lacks changes the old primary committed"
            )
    found = await conn.fetchval(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot
    )
    if found is None:
        raise PositionLost(
            f"replication slot {slot!r} does not exist on the new primary (physical replication does not "
            "copy slots: create it there, or use an HA tool that keeps slots)"
        )
    start = parse_lsn(found)
    if start > checkpoint_lsn and await _captured_changes(conn, publication, checkpoint_lsn, start):
        raise PositionLost(
            f"captured tables changed between the checkpoint {format_lsn(checkpoint_lsn)} and the start of "
            f"slot {slot!r} at {format_lsn(start)} on the new primary; that slot cannot decode them"
        )


async def _switch_point(conn: asyncpg.Connection, old_tl: int, new_tl: int) -> int:
    """Where timeline ``new_tl``'s history left ``old_tl`` (its history file)."""
    try:
        text = str(await conn.fetchval(HISTORY, new_tl))
    except asyncpg.PostgresError as exc:
        raise Undeterminable(f"cannot read timeline {new_tl}'s history: {exc}") from None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and int(parts[0]) == old_tl:
            return parse_lsn(parts[1])
    raise Undeterminable(f"timeline {new_tl}'s history does not name timeline {old_tl}")


async def _captured_changes(conn: asyncpg.Connection, publication: str, start: int, end: int) -> int:
    """How many heap records of the publication's tables lie in [start, end)."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        files = await conn.fetch(CAPTURED_FILES, publication)
        patterns = [f"%rel {spc}/{db}/{node} %" for spc, db, node in files]
        return int(await conn.fetchval(CHANGES_BETWEEN, start, end, patterns))
    except asyncpg.PostgresError as exc:
        raise Undeterminable(f"cannot inspect the WAL between the checkpoint and the slot: {exc}") from None
