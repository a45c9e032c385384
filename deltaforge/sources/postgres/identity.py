"""Replica identity: PostgreSQL refuses UPDATE and DELETE on a published table without one (no
primary key under ``REPLICA IDENTITY DEFAULT``, or ``NOTHING``), so a publication that would cover
such a table breaks the application the moment the pipeline starts."""

from __future__ import annotations

import asyncpg

from deltaforge.sources.base import SourceMisconfigured
from deltaforge.sources.postgres.names import quote_table

_WITHOUT_IDENTITY = (
    "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND {which} AND (c.relreplident = 'n' OR "
    "(c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))) "
    "ORDER BY 1"
)
_USER_TABLES = "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"
# pg_partition_tree lists nothing for a table that is not partitioned: the tables themselves too
_THESE_TABLES = (
    "(c.oid IN (SELECT to_regclass(x) FROM unnest($1::text[]) x) OR "
    "c.oid IN (SELECT t.relid FROM unnest($1::text[]) x, pg_partition_tree(to_regclass(x)) t))"
)


async def without_identity(conn: asyncpg.Connection, tables: list[str] | None) -> list[str]:
    """The tables (``tables`` and their partitions; None: every user table) without a replica
    identity: no primary key under REPLICA IDENTITY DEFAULT, or NOTHING. PostgreSQL refuses UPDATE
    and DELETE on such a table while a publication of updates and deletes covers it."""
    if tables is None:
        return [str(r[0]) for r in await conn.fetch(_WITHOUT_IDENTITY.format(which=_USER_TABLES))]
    if not tables:
        return []
    names = [quote_table(t) for t in tables]
    return [str(r[0]) for r in await conn.fetch(_WITHOUT_IDENTITY.format(which=_THESE_TABLES), names)]


async def refuse_without_identity(
    conn: asyncpg.Connection, tables: list[str] | None, doing: str, who: str
) -> None:
    """Refuse ``doing`` (putting ``tables`` in a publication; None: all tables) when it would make
    the user's UPDATE and DELETE fail on a table without a replica identity: the application
    breaks the moment the pipeline starts."""
    stuck = await without_identity(conn, tables)
    if stuck:
        raise SourceMisconfigured(
            f"{who}: {doing} would make UPDATE and DELETE fail on {', '.join(stuck)}: "
            "PostgreSQL refuses them on a published table without a replica identity (no primary key, "
            "or REPLICA IDENTITY NOTHING). Give each a primary key or run ALTER TABLE ... REPLICA "
            "IDENTITY FULL" + ("" if tables else ", or list the tables to capture in tables")
        )
