"""The publication a PostgreSQL source reads through, on the source's control connection.

What a publication does not cover, pgoutput never sends, and nothing says so: a table left out,
a kind of change not published, rows outside a row filter. Checked at each opening (refused,
added, or named in the log), against what the last opening noted (:data:`Memberships`), and
again every few seconds while streaming (``publication_watch.py``).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from deltaforge.sources.base import SourceMisconfigured
from deltaforge.sources.postgres.identity import refuse_without_identity, without_identity
from deltaforge.sources.postgres.names import quote_ident, quote_table

_PUBLICATION = (
    "SELECT oid, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot "
    "FROM pg_publication WHERE pubname = $1"
)


def _unpublished_ops(pub: asyncpg.Record) -> list[str]:
    """The kinds of change the publication row ``pub`` leaves out."""
    return [op for op in ("insert", "update", "delete", "truncate") if not pub[f"pub{op}"]]


async def check_publication(
    conn: asyncpg.Connection, publication: str, listed: list[str], create: bool, who: str
) -> None:
    """The publication publishes every kind of change, and every listed table: what it leaves out
    is never decoded, so never delivered, and nothing would say so. A listed table it lacks is
    added when the source manages it (``create``), as Debezium's ``filtered`` autocreate mode does
    (a table added to ``tables`` later is captured from then on); anything else is refused, saying
    what to run."""
    pub = await conn.fetchrow(_PUBLICATION, publication)
    if pub is None:
        raise SourceMisconfigured(
            f"{who}: publication {publication!r} does not exist (dropped?); the slot's changes cannot be "
            f"decoded without it: create it again (CREATE PUBLICATION {quote_ident(publication)} ...) and "
            "re-snapshot, or drop the slot to start afresh"
        )
    ops = _unpublished_ops(pub)
    if ops:
        raise SourceMisconfigured(
            f"{who}: publication {publication!r} does not publish {', '.join(ops)}, so those changes would "
            f"never be delivered; ALTER PUBLICATION {quote_ident(publication)} SET "
            "(publish = 'insert, update, delete, truncate')"
        )
    stuck = await without_identity(conn, None if pub["puballtables"] else listed or [])
    if stuck:
        structlog.get_logger().warning(
            "tables_without_replica_identity", actor="PostgresSource", publication=publication, tables=stuck,
            reason="PostgreSQL refuses UPDATE and DELETE on a published table without a replica identity; "
            "give each a primary key or REPLICA IDENTITY FULL",
        )  # fmt: skip
    if pub["puballtables"] and listed:
        _not_listed(publication, ["*"])
    if pub["puballtables"]:
        # FOR ALL TABLES takes in unlogged tables without a word, and their changes are never in
        # the WAL: say which, at every open (a table set unlogged later is named then).
        unlogged = await conn.fetch(_UNLOGGED)
        if unlogged:
            structlog.get_logger().warning(
                "unlogged_tables_not_captured", actor="PostgresSource", publication=publication,
                tables=[str(r[0]) for r in unlogged],
                reason="unlogged tables are not written to the WAL, so logical decoding never sees their changes",
            )  # fmt: skip
        return
    await _name_filters(conn, pub["oid"], publication)
    if not listed:
        return
    missing, oids = [], []
    for table in dict.fromkeys(listed):
        oid = await _oid(conn, table)
        if oid is None:
            raise SourceMisconfigured(f"{who}: table {table!r} in tables does not exist")
        oids.append(oid)
        if not await _published(conn, pub["oid"], oid):
            missing.append(table)
    query = _EXTRA if conn.get_server_version().major >= 15 else _EXTRA_14
    if extra := [str(r[0]) for r in await conn.fetch(query, pub["oid"], oids)]:
        _not_listed(publication, extra)
    if not missing:
        return
    add = (
        f"ALTER PUBLICATION {quote_ident(publication)} ADD TABLE {', '.join(quote_table(t) for t in missing)}"
    )
    if create:
        await refuse_without_identity(
            conn, missing, f"adding {', '.join(missing)} to publication {publication!r}", who
        )
        try:
            await conn.execute(add)
        except asyncpg.PostgresError as exc:
            raise SourceMisconfigured(
                f"{who}: publication {publication!r} does not include {', '.join(missing)}, and adding "
                f"them failed ({exc}); run {add}"
            ) from None
        structlog.get_logger().info(
            "publication_tables_added", actor="PostgresSource", publication=publication, tables=missing
        )
        return
    raise SourceMisconfigured(
        f"{who}: publication {publication!r} does not include {', '.join(missing)}, so their changes would "
        f"never be delivered; run {add} (or set create: true to let deltaforge add them)"
    )


_EXTRA_14 = (
    "SELECT n.nspname || '.' || c.relname FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE r.prpubid = $1 AND NOT r.prrelid = ANY($2::oid[])"
)
_EXTRA = f"{_EXTRA_14} UNION ALL SELECT n.nspname || '.*' FROM pg_publication_namespace p " + (
    "JOIN pg_namespace n ON n.oid = p.pnnspid WHERE p.pnpubid = $1 ORDER BY 1"
)
"""What a publication publishes besides the listed tables (oids): other tables it names, and
(PostgreSQL 15) whole schemas, as ``schema.*``."""


def _not_listed(publication: str, tables: list[str]) -> None:
    """Say that the publication publishes ``tables`` (``*``: every table) besides those listed."""
    structlog.get_logger().warning(
        "publication_tables_not_listed", actor="PostgresSource", publication=publication, tables=tables,
        reason="pgoutput sends the changes of every table the publication publishes, whatever tables lists, "
        "so these are delivered too. A publication two pipelines share (two configs with the default "
        "'deltaforge': each adds the tables it lists) does this: give each pipeline a publication and slot "
        "of its own, or take these out of the publication",
    )  # fmt: skip


# PostgreSQL 15: row filters and column lists
_FILTERS = (
    "SELECT n.nspname || '.' || c.relname, pg_get_expr(r.prqual, r.prrelid), "
    "(SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
    " WHERE a.attrelid = r.prrelid AND a.attnum = ANY(r.prattrs)) "
    "FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE r.prpubid = $1 AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL) ORDER BY 1"
)


async def _name_filters(conn: asyncpg.Connection, pub: int, publication: str) -> None:
    """Log the publication's row filters and column lists: what they leave out is never decoded.
    A user's choice, so not refused, but said at every open (snapshots apply the same ones)."""
    if conn.get_server_version().major < 15:
        return
    found = await conn.fetch(_FILTERS, pub)
    if found:
        structlog.get_logger().warning(
            "publication_filters", actor="PostgresSource", publication=publication,
            tables={str(r[0]): {"columns": r[2], "rows": r[1]} for r in found},
            reason="changes to rows outside a row filter, and columns outside a column list, are not published, "
            "so never delivered; snapshots read the same rows and columns",
        )  # fmt: skip


Memberships = dict[str, Any]
"""Which catalog rows make a publication cover what a source reads: ``{"publication": oid, "tables":
{table: [row, ...]}, "oids": {table: oid}, "unlogged": [table, ...], "via_root": bool}``, each row
``table:<pg_publication_rel oid>`` (the table's or an ancestor's) or
``schema:<pg_publication_namespace oid>``. Taking a table out of a publication deletes its row
and putting it back makes a new one, so two of these with no row in common for a table mean it was
out in between (or that ``SET TABLE`` changed its row filter or column list, which replaces the
row); the rows replicate with the catalog, so a standby promoted has the same."""


async def memberships(conn: asyncpg.Connection, publication: str, listed: list[str]) -> Memberships | None:
    """The publication's and each listed table's :data:`Memberships` (None: no publication)."""
    pub = await conn.fetchrow(_PUBLICATION, publication)
    return None if pub is None else await _memberships_of(conn, pub, listed)


async def _memberships_of(conn: asyncpg.Connection, row: asyncpg.Record, listed: list[str]) -> Memberships:
    """The :data:`Memberships` of the publication whose :data:`_PUBLICATION` row is ``row``."""
    pub = int(row["oid"])
    tables: dict[str, list[str]] = {}
    oids: dict[str, int] = {}
    for table in dict.fromkeys(listed):
        oid = await _oid(conn, table)  # a table dropped since has nothing more to send
        if oid is not None:
            tables[table], oids[table] = sorted(await _rows(conn, pub, oid)), oid
    if unpublished := [oids[t] for t, rows in tables.items() if not rows]:
        # A table dropped between its two lookups above has no publication row left, which
        # alone reads as "taken out of the publication": it is dropped, and counted as such.
        for oid in await conn.fetchval(_GONE, unpublished):
            table = next(t for t, o in oids.items() if o == oid)
            del tables[table], oids[table]
    if listed:
        unlogged = list(await conn.fetchval(_UNLOGGED_OF, list(oids.values()))) if oids else []
    else:  # all tables
        unlogged = [str(r[0]) for r in await conn.fetch(_UNLOGGED)]
    via_root = bool(row["pubviaroot"])
    return {"publication": pub, "tables": tables, "oids": oids, "unlogged": unlogged, "via_root": via_root}


def out_in_between(before: Memberships, now: Memberships | None, publication: str) -> str | None:
    """What was out of the publication at some moment between ``before`` and ``now`` (a table,
    or the whole publication dropped and made again), or None."""
    if now is None:
        return f"publication {publication!r} was dropped"
    if now["publication"] != before.get("publication"):
        return f"publication {publication!r} was dropped and created again"
    was: dict[str, list[str]] = before.get("tables") or {}
    oids: dict[str, int] = before.get("oids") or {}
    for table, rows in now["tables"].items():
        if was.get(table) and not set(was[table]) & set(rows):
            if table in oids and oids[table] != now["oids"].get(table):
                return f"table {table} was dropped and created again"
            if not rows:
                return f"table {table} was taken out of publication {publication!r}"
            # ALTER PUBLICATION ... SET TABLE replaces a table's row when its row filter or column
            # list changes: no gap then, but rows and columns the sinks never had are now covered
            # (and ones they have no longer are), which only a snapshot puts right.
            return (
                f"table {table} was taken out of publication {publication!r} and put back, or its row "
                "filter or column list was changed"
            )
    return None


async def left_out(
    conn: asyncpg.Connection, publication: str, listed: list[str], at_open: Memberships | None
) -> tuple[str | None, Memberships | None]:
    """What the publication no longer publishes of what it did at open (a listed table, or a kind
    of change), or what it left out for a moment since (taken out and put back between two asks),
    or None: asked while streaming, since pgoutput stops sending what a publication stops covering
    without a word, and never sends it later. With it, the :data:`Memberships` now."""
    pub = await conn.fetchrow(_PUBLICATION, publication)
    if pub is None:
        return f"publication {publication!r} was dropped", None
    ops = _unpublished_ops(pub)
    if ops:
        return f"publication {publication!r} stopped publishing {', '.join(ops)}", None
    now = await _memberships_of(conn, pub, listed)  # one look at each table per ask
    was: dict[str, int] = (at_open or {}).get("oids") or {}
    for table, rows in now["tables"].items():
        if not rows:
            if table in was and was[table] != now["oids"][table]:
                renamed = await conn.fetchval(_NAME_OF, was[table])
                how = (
                    f"renamed to {renamed}, and another table took its name"
                    if renamed
                    else "dropped and created again"
                )
                return (
                    f"table {table} was {how}, and the new table is not in publication {publication!r}",
                    now,
                )
            return f"table {table} was taken out of publication {publication!r}", now
    if at_open is None:
        return None, now
    # A publication FOR TABLES IN SCHEMA or FOR ALL TABLES does not stop ALTER TABLE ... SET
    # UNLOGGED (one naming the table does): the table's changes leave the WAL, and SET LOGGED
    # later writes its rows back without a change for any of them.
    newly = sorted(set(now["unlogged"]) - set(at_open.get("unlogged") or ()))
    if newly:
        return (
            f"table {newly[0]} was set UNLOGGED: its changes are no longer written to the WAL, so never decoded"
        ), now
    return out_in_between(at_open, now, publication), now


_NAME_OF = (
    "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.oid = $1"
)
_GONE = "SELECT array(SELECT x FROM unnest($1::oid[]) x WHERE NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = x))"


async def dropped(
    conn: asyncpg.Connection, at_open: Memberships, now: Memberships, known: set[str]
) -> list[str]:
    """The listed tables that existed at open and exist no more (but those ``known``). A table
    found under no name it had may have been renamed (the publication follows it, and its changes arrive under the new
    name) or dropped: pgoutput sends nothing for a DROP TABLE."""
    was: dict[str, int] = at_open.get("oids") or {}
    unnamed = {oid: t for t, oid in was.items() if t not in now["oids"] and t not in known}
    if not unnamed:
        return []
    return [unnamed[int(oid)] for oid in await conn.fetchval(_GONE, list(unnamed))]


_UNLOGGED = (
    "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relpersistence = 'u' AND c.relkind IN ('r', 'p') ORDER BY 1"
)
_UNLOGGED_OF = (
    "SELECT array(SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relpersistence = 'u' AND c.oid = ANY($1::oid[]) ORDER BY 1)"
)
_REL_ROWS = (
    "SELECT array(SELECT 'table:' || oid::text FROM pg_publication_rel WHERE prpubid = $1 AND prrelid IN "
    "(SELECT $2::oid UNION SELECT relid FROM pg_partition_ancestors($2::oid)))"
)
# PostgreSQL 15: FOR TABLES IN SCHEMA
_SCHEMA_ROWS = (
    "SELECT array(SELECT 'schema:' || n.oid::text FROM pg_publication_namespace n "
    "JOIN pg_class c ON c.relnamespace = n.pnnspid WHERE n.pnpubid = $1 AND c.oid = $2::oid)"
)


async def _oid(conn: asyncpg.Connection, table: str) -> int | None:
    """``table``'s oid, or None when there is no such table."""
    oid = await conn.fetchval("SELECT to_regclass($1)::oid", quote_table(table))
    return None if oid is None else int(oid)


async def _rows(conn: asyncpg.Connection, pub: int, oid: int) -> list[str]:
    """The catalog rows by which the publication ``pub`` (oid) publishes the table ``oid``: it
    named, a partitioned table it is a partition of named, or its schema. Not
    ``pg_publication_tables``: that lists a published partitioned table's partitions, not the table."""
    found = list(await conn.fetchval(_REL_ROWS, pub, oid))
    if conn.get_server_version().major >= 15:
        found += await conn.fetchval(_SCHEMA_ROWS, pub, oid)
    return found


async def _published(conn: asyncpg.Connection, pub: int, oid: int) -> bool:
    """Whether the publication ``pub`` (oid) publishes the table ``oid``."""
    return bool(await _rows(conn, pub, oid))
