"""The labels of the enums captured columns hold, watched while streaming and between runs.

``ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'`` changes every row that holds ``'sad'`` (as the
enum, in an array of it, through a domain over it, inside a composite) without a change for any
of them, and pgoutput sends no Relation message for it (the columns' type is the same type). The
sinks would keep ``'sad'`` and nothing would say so. An enum's labels can be renamed and added,
never removed; a renamed one keeps its ``pg_enum`` row (and oid). Each rename is handed to the pipeline as
:class:`~deltaforge.sources.base.ColumnsRewritten` (``columns_changed``, and a snapshot under
``on_column_change: snapshot``). A label added changes no row.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from deltaforge.sources.base import ColumnsRewritten

# Every column of the publication's tables, followed through domains (their base type), arrays
# (their element type) and composites (their attributes' types) down to the enums it holds.
_ENUM_COLUMNS = """
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
SELECT n.nspname || '.' || c.relname AS tbl, col.attname, col.typ::bigint, col.typ::regtype::text,
       array(SELECT array[e.oid::bigint::text, e.enumlabel::text] FROM pg_enum e
             WHERE e.enumtypid = col.typ ORDER BY e.enumsortorder)
FROM col
JOIN pg_type t ON t.oid = col.typ AND t.typtype = 'e'
JOIN pg_class c ON c.oid = col.rel JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY 1, col.attnum, 3
"""

Labels = list[list[Any]]
"""``[table, column, enum oid, enum name, [[label oid, label], ...]]`` per enum a captured column
holds, in table and column order (JSON: kept in the source's memo). A renamed label keeps its
``pg_enum`` row, so its oid pairs the old name with the new."""


class EnumWatch:
    """The labels of the enums each captured column holds, as last looked at.

    :meth:`memo` says the labels whose renames the pipeline has taken (:meth:`take`): a rename
    found but not yet taken when the process stops is found again at the next opening."""

    def __init__(self, listed: list[str]) -> None:
        self.listed = set(listed)
        """The captured tables (none: every table the publication has)."""
        self.current: Labels = []
        self._taken: Labels = []
        self._found: list[ColumnsRewritten] = []

    async def opened(self, conn: asyncpg.Connection, publication: str, noted: Labels | None) -> None:
        """Look at the labels now; with what the last run noted, find the renames since."""
        self._found = []
        now = await self._labels(conn, publication)
        if noted is not None:
            self._found = _renamed(noted, now)
        self.current = now
        self._taken = noted if self._found and noted is not None else now

    async def check(self, conn: asyncpg.Connection, publication: str) -> None:
        """Find the renames since the last look."""
        now = await self._labels(conn, publication)
        self._found += _renamed(self.current, now)
        self.current = now

    def take(self) -> list[ColumnsRewritten]:
        """The renames found since the last call; from now on the memo notes them as taken."""
        found, self._found = self._found, []
        self._taken = self.current
        return found

    def memo(self) -> Labels:
        return self._taken

    async def _labels(self, conn: asyncpg.Connection, publication: str) -> Labels:
        rows = await conn.fetch(_ENUM_COLUMNS, publication)
        return [
            [str(r[0]), str(r[1]), int(r[2]), str(r[3]), [[int(oid), str(label)] for oid, label in r[4]]]
            for r in rows
            if not self.listed or str(r[0]) in self.listed
        ]


def _renamed(was: Labels, now: Labels) -> list[ColumnsRewritten]:
    """Per table, the columns holding an enum one of whose labels was renamed between ``was``
    and ``now``."""
    before = {(str(t), str(c), int(oid)): dict(map(tuple, labels)) for t, c, oid, _, labels in was}
    columns: dict[str, list[str]] = {}
    changes: dict[str, dict[str, None]] = {}
    for table, column, oid, name, labels in now:
        old = before.get((table, column, oid), {})
        renamed = [(old[o], label) for o, label in labels if o in old and old[o] != label]
        if not renamed:
            continue
        if column not in columns.setdefault(table, []):
            columns[table].append(column)
        said = ", ".join(f"{a!r} to {b!r}" for a, b in renamed)
        changes.setdefault(table, {})[f"ALTER TYPE {name} RENAME VALUE ({said})"] = None
    how = "changed every row holding the old value, without a change event"
    return [ColumnsRewritten(t, tuple(cols), f"{'; '.join(changes[t])} {how}") for t, cols in columns.items()]
