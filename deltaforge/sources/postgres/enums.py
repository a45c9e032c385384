"""The labels of the enums captured columns hold, watched while streaming and between runs.

``ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'`` changes every row that holds ``'sad'`` (as the
enum, in an array of it, through a domain over it, inside a composite) without a change for any
of them, and pgoutput sends no Relation message for it (the columns' type is the same type). The
sinks would keep ``'sad'`` and nothing would say so. An enum's labels can be renamed and added,
never removed; a renamed one keeps its ``pg_enum`` row (and oid). So every check reads
``pg_enum`` (small, and cheap to read: the columns of thousands of tables are not) and compares
each label by its oid; only when one was renamed does it ask which captured columns hold that
enum. Each such column is handed to the pipeline as
:class:`~deltaforge.sources.base.ColumnsRewritten` (``columns_changed``, and a snapshot under
``on_column_change: snapshot``). A label added changes no row.
"""

from __future__ import annotations

import asyncpg

from deltaforge.sources.base import ColumnsRewritten

_LABELS = "SELECT enumtypid::bigint, oid::bigint, enumlabel::text FROM pg_enum"
"""Every enum label of the database (a small catalog: read at every check, in well under a ms)."""

# The columns of the publication's tables that hold one of the enums $2, followed through domains
# (their base type), arrays (their element type) and composites (their attributes' types), each
# table's name then its partition ancestors', nearest first (the publication lists a partitioned table's
# partitions unless publish_via_partition_root is on). Asked only when a label was renamed.
_COLUMNS_HOLDING = """
WITH RECURSIVE col(rel, attnum, attname, typ) AS (
    SELECT c.oid, a.attnum, a.attname::text, a.atttypid
    FROM pg_publication_tables p
    JOIN pg_namespace n ON n.nspname = p.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE p.pubname = $1
  UNION
    SELECT col.rel, col.attnum, col.attname, x.typ
    FROM col JOIN pg_type t ON t.oid = col.typ
    CROSS JOIN LATERAL (
        SELECT t.typbasetype WHERE t.typtype = 'd'
        UNION ALL SELECT t.typelem WHERE t.typcategory = 'A' AND t.typelem <> 0
        UNION ALL SELECT a.atttypid FROM pg_attribute a
            WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
    ) x(typ)
)
SELECT array[n.nspname || '.' || c.relname] || array(
           SELECT an.nspname || '.' || ac.relname
           FROM pg_partition_ancestors(c.oid) WITH ORDINALITY AS x(relid, i)
           JOIN pg_class ac ON ac.oid = x.relid JOIN pg_namespace an ON an.oid = ac.relnamespace
           WHERE x.relid <> c.oid ORDER BY x.i),
       col.attname, col.typ::bigint, col.typ::regtype::text
FROM col
JOIN pg_class c ON c.oid = col.rel JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE col.typ = ANY($2::bigint[]::oid[])
ORDER BY 1, col.attnum, 3
"""

Labels = dict[str, dict[str, str]]
"""Every enum's labels: ``{enum oid: {label oid: label}}`` (JSON: kept in the source's memo). A
renamed label keeps its ``pg_enum`` row, so its oid pairs the old name with the new."""


class EnumWatch:
    """The labels of the database's enums, as last looked at.

    :meth:`memo` says the labels whose renames the pipeline has taken (:meth:`take`): a rename
    found but not yet taken when the process stops is found again at the next opening."""

    def __init__(self, listed: list[str]) -> None:
        self.listed = set(listed)
        """The captured tables (none: every table the publication has)."""
        self.current: Labels = {}
        self._taken: Labels = {}
        self._found: list[ColumnsRewritten] = []

    async def opened(self, conn: asyncpg.Connection, publication: str, noted: Labels | None) -> None:
        """Look at the labels now; with what the last run noted, find the renames since."""
        self._found = []
        now = await _labels(conn)
        if not isinstance(noted, dict):
            noted = None  # not noted, or noted as 57b6935 did (per column): compared from now on
        if noted is not None:
            self._found = await self._columns(conn, publication, _renamed(noted, now))
        self.current = now
        self._taken = noted if self._found and noted is not None else now

    async def check(self, conn: asyncpg.Connection, publication: str) -> None:
        """Find the renames since the last look."""
        now = await _labels(conn)
        if now != self.current:
            self._found += await self._columns(conn, publication, _renamed(self.current, now))
            self.current = now

    def take(self) -> list[ColumnsRewritten]:
        """The renames found since the last call; from now on the memo notes them as taken."""
        found, self._found = self._found, []
        self._taken = self.current
        return found

    def memo(self) -> Labels:
        return self._taken

    async def _columns(
        self, conn: asyncpg.Connection, publication: str, renamed: dict[int, list[tuple[str, str]]]
    ) -> list[ColumnsRewritten]:
        """Per captured table, the columns holding an enum of ``renamed`` (its labels' old and
        new names)."""
        if not renamed:
            return []
        columns: dict[str, list[str]] = {}
        changes: dict[str, dict[str, None]] = {}
        for names, column, typ, name in await conn.fetch(_COLUMNS_HOLDING, publication, list(renamed)):
            # under its own name, or the nearest partitioned table listed (which a snapshot reads whole)
            table = next((t for t in names if t in self.listed), None) if self.listed else names[0]
            if table is None:
                continue
            if column not in columns.setdefault(table, []):
                columns[table].append(column)
            said = ", ".join(f"{a!r} to {b!r}" for a, b in renamed[int(typ)])
            changes.setdefault(table, {})[f"ALTER TYPE {name} RENAME VALUE ({said})"] = None
        how = "changed every row holding the old value, without a change event"
        return [
            ColumnsRewritten(t, tuple(cols), f"{'; '.join(changes[t])} {how}") for t, cols in columns.items()
        ]


async def _labels(conn: asyncpg.Connection) -> Labels:
    labels: Labels = {}
    for typ, oid, label in await conn.fetch(_LABELS):
        labels.setdefault(str(typ), {})[str(oid)] = str(label)
    return labels


def _renamed(was: Labels, now: Labels) -> dict[int, list[tuple[str, str]]]:
    """The enums one of whose labels was renamed between ``was`` and ``now``, with each renamed
    label's old and new name (in label oid order)."""
    renamed: dict[int, list[tuple[str, str]]] = {}
    for typ, labels in now.items():
        old = was.get(typ, {})
        pairs = [(old[o], labels[o]) for o in sorted(labels, key=int) if o in old and old[o] != labels[o]]
        if pairs:
            renamed[int(typ)] = pairs
    return renamed
