"""The partitions of listed partitioned tables, watched while streaming.

A table attached as a partition (``ALTER TABLE orders ATTACH PARTITION staging …``, the fast way
to bulk-load) brings its rows into a captured table without a change for any of them: pgoutput
publishes its changes from then on, never the rows it held. A partition detached takes its rows
out of the captured table, also without a change: the sinks keep them. Neither is an error, and
neither can be delivered, so each is named (``captured_partition_attached``,
``captured_partition_detached``) with the ``deltaforge snapshot`` that puts the sinks right.

A partition made with ``CREATE TABLE … PARTITION OF`` is new and empty, and its rows arrive as
changes. A partition the check before did not see is told from one that existed then by its oid,
newer than every relation that check saw (``max(oid)`` of ``pg_class``; oids grow until they wrap
at 2^32). The one that existed was attached: named if it holds rows. A new one may still have been
made, loaded and attached since, the bulk load done in one go (one script, or one transaction): it
is named if a row of it is older than its being a partition, written by a transaction before the
one whose ``pg_class`` row for it is current (ATTACH writes that row anew; PARTITION OF makes it),
or by an earlier command of that same transaction (``cmin``). Rows written into a partition made
with PARTITION OF, or attached empty, are all newer.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

_TREE = "SELECT array(SELECT relid::bigint FROM pg_partition_tree($1::oid) WHERE relid <> $1::oid ORDER BY 1)"
_NEWEST = "SELECT max(oid)::bigint FROM pg_class"
_NAMES = "SELECT array(SELECT x::regclass::text FROM unnest($1::oid[]) x ORDER BY 1)"


class PartitionWatch:
    """The partitions of each listed table (none for a table that is not partitioned)."""

    def __init__(self) -> None:
        self.trees: dict[str, set[int]] = {}
        self.newest = 0

    async def opened(
        self, conn: asyncpg.Connection, oids: dict[str, int], noted: dict[str, Any] | None
    ) -> None:
        """Note each listed table's partitions as they are now; with what the last run noted
        (:meth:`memo`, resuming on the same server), name what was attached or detached since."""
        if noted:
            self.trees = {str(t): {int(p) for p in parts} for t, parts in (noted.get("trees") or {}).items()}
            self.newest = int(noted.get("newest") or 0)
            await self.check(conn, oids)
        trees = {table: set(await conn.fetchval(_TREE, oid)) for table, oid in oids.items()}
        self.trees = {table: tree for table, tree in trees.items() if tree}
        self.newest = int(await conn.fetchval(_NEWEST)) if self.trees else 0

    def memo(self) -> dict[str, Any]:
        """What the next opening compares with."""
        return {"trees": {t: sorted(parts) for t, parts in self.trees.items()}, "newest": self.newest}

    async def check(self, conn: asyncpg.Connection, oids: dict[str, int]) -> None:
        """Name the partitions attached to (holding rows) or detached from a listed table since the
        last check."""
        if not self.trees:
            return
        newest = int(await conn.fetchval(_NEWEST))
        for table, was in self.trees.items():
            oid = oids.get(table)
            now = set(await conn.fetchval(_TREE, oid)) if oid is not None else set()
            attached = [
                p for p in sorted(now - was)
                if await (_holds_rows(conn, p) if p <= self.newest else _loaded_before_attached(conn, p))
            ]  # fmt: skip
            detached = sorted(was - now) if oid is not None else []  # dropped whole: said elsewhere
            for event, parts, what in (
                ("captured_partition_attached", attached, "the rows it held before were never sent as changes"),
                ("captured_partition_detached", detached, "its rows left the table without a change: the sinks keep them"),
            ):  # fmt: skip
                if parts:
                    structlog.get_logger().warning(
                        event, actor="PostgresSource", table=table,
                        partitions=list(await conn.fetchval(_NAMES, parts)),
                        reason=f"{what} (snapshot the table again: deltaforge snapshot <pipeline> {table})",
                    )  # fmt: skip
            self.trees[table] = now
        self.newest = newest


async def _holds_rows(conn: asyncpg.Connection, oid: int) -> bool:
    """Whether partition ``oid`` holds a row (one the source's user may not read: taken as yes)."""
    return await _exists(conn, oid, "SELECT 1 FROM {}")


_OLDER = (
    "SELECT 1 FROM {} r, (SELECT xmin AS x, cmin::text::bigint AS c FROM pg_class WHERE oid = $1) k "
    "WHERE age(r.xmin) > age(k.x) OR (r.xmin = k.x AND r.cmin::text::bigint < k.c)"
)


async def _loaded_before_attached(conn: asyncpg.Connection, oid: int) -> bool:
    """Whether partition ``oid``, made since the last check, holds a row written before it was a
    partition (see the module; one the source's user may not read: taken as yes)."""
    return await _exists(conn, oid, _OLDER, oid)


async def _exists(conn: asyncpg.Connection, oid: int, rows: str, *args: Any) -> bool:
    name = await conn.fetchval("SELECT $1::oid::regclass::text", oid)
    try:
        return bool(await conn.fetchval(f"SELECT EXISTS ({rows.format(name)})", *args))
    except asyncpg.InsufficientPrivilegeError:
        return True
