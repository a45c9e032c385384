"""Turso's side of snapshots: exact, with no watermark writes.

The database is embedded: the reader's own connection selects a chunk and the last
``turso_cdc`` change in one read transaction, so the chunk is the table exactly as of that
change ``M``. Nothing can change between a low and a high watermark at ``M``: the source
emits both marks once its stream has passed ``M`` (after every change at or before it, before
any after it), and the chunk's rows follow them. One table at a time (each chunk has its own
``M``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaforge.events import Event, Row, SourceInfo
from deltaforge.position import Position
from deltaforge.snapshot.chunks import ChunkReader, SnapshotRefused, plain_rows
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.turso.position import TursoPosition
from deltaforge.sources.turso.record import INFINITIES
from deltaforge.sources.turso.record import quote_name as _quote

if TYPE_CHECKING:
    from deltaforge.sources.turso.source import TursoSource

MARKS = "__deltaforge_snapshot"
"""The table name snapshot marks carry in the stream (no such table exists)."""
OPEN, CLOSE = "snapshot-window-open", "snapshot-window-close"


class TursoChunks(ChunkReader):
    """Chunks of a :class:`TursoSource`, read on its connection (see the module)."""

    parallel = False

    def __init__(self, source: TursoSource) -> None:
        self.source = source
        self.read_at: TursoPosition = TursoPosition(0)
        self.keys: dict[str, tuple[str, ...]] = {}

    async def open(self, parallel: int) -> None:
        pass

    async def close(self) -> None:
        pass

    async def tables(self, names: list[str] | None) -> list[TableRef]:
        return await self.source._threads.run(self._tables, names)

    def _tables(self, names: list[str] | None) -> list[TableRef]:
        conn = self.source.connection()
        present = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                "AND name NOT LIKE '__turso_internal%' AND name NOT LIKE 'turso_cdc%' ORDER BY name"
            ).fetchall()
        ]
        captured = [t for t in present if self.source.tables is None or t in self.source.tables]
        out = []
        for name in names or captured:
            if name not in captured:
                conn.commit()
                raise SnapshotRefused(f"snapshot of {name!r}: no such table among the captured ones "
                                      f"({', '.join(captured) or 'none'})")  # fmt: skip
            info = conn.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
            key = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
            if not key:
                conn.commit()
                raise SnapshotRefused(
                    f"snapshot of {name!r}: the table has no primary key, and snapshots read tables in "
                    "primary-key ranges; add a primary key, or leave the table out of snapshot.tables"
                )
            self.keys[name] = key
            out.append(TableRef(name, key))
        conn.commit()
        return out

    async def estimate(self, table: TableRef) -> int:
        def count() -> int:
            conn = self.source.connection()
            n = int(conn.execute(f"SELECT count(*) FROM {_quote(table.name)}").fetchone()[0])
            conn.commit()
            return n

        return await self.source._threads.run(count)

    bounded = True

    async def last_key(self, table: TableRef) -> list[Any] | None:
        keys = table.key

        def read() -> list[Any] | None:
            conn = self.source.connection()
            order = ", ".join(f"{_quote(k)} DESC" for k in keys)
            row = conn.execute(
                f"SELECT {', '.join(_quote(k) for k in keys)} FROM {_quote(table.name)} ORDER BY {order} LIMIT 1"
            ).fetchone()
            conn.commit()
            return None if row is None else list(row)

        return await self.source._threads.run(read)

    async def remaining(self, table: TableRef, after: list[Any], bound: list[Any]) -> bool:
        keys, marks = ", ".join(_quote(k) for k in table.key), ", ".join("?" * len(table.key))

        def read() -> bool:
            conn = self.source.connection()
            found = conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM {_quote(table.name)} WHERE ({keys}) > ({marks}) "
                f"AND ({keys}) <= ({marks}))",
                (*after, *bound),
            ).fetchone()
            conn.commit()
            return bool(found and found[0])

        return await self.source._threads.run(read)

    async def chunk(
        self, table: TableRef, after: list[Any] | None, limit: int
    ) -> tuple[list[Row], list[Any] | None, bool]:
        return await self.source._threads.run(self._chunk, table, after, limit)

    def _chunk(
        self, table: TableRef, after: list[Any] | None, limit: int
    ) -> tuple[list[Row], list[Any] | None, bool]:
        conn = self.source.connection()
        keys = ", ".join(_quote(k) for k in table.key)
        where = f"WHERE ({keys}) > ({', '.join('?' * len(table.key))}) " if after is not None else ""
        # One read transaction: the chunk is the table as of the last change committed, M.
        has_cdc = conn.execute(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'turso_cdc'"
        ).fetchall()
        last = conn.execute(
            "SELECT change_id, change_txn_id, change_time FROM turso_cdc ORDER BY change_id DESC LIMIT 1"
        ).fetchone() if has_cdc else None  # fmt: skip
        cursor = conn.execute(
            f"SELECT * FROM {_quote(table.name)} {where}ORDER BY {keys} LIMIT ?", (*(after or ()), limit + 1)
        )
        names = [d[0] for d in cursor.description]
        rows = plain_rows(tuple(names))(cursor.fetchall())
        for row in rows:  # an infinite REAL as the stream has it (record.INFINITIES)
            for name, value in row.items():
                if type(value) is float and value in INFINITIES:
                    row[name] = INFINITIES[value]
        conn.commit()
        more = len(rows) > limit
        rows = rows[:limit]
        resets = self.source.resets
        if last:
            self.read_at = TursoPosition(int(last[0]), int(last[1]), int(last[2]), resets=resets)
        else:
            self.read_at = TursoPosition(0, resets=resets)
        return rows, ([rows[-1][k] for k in table.key] if rows else after), more

    async def watermark(self, kind: str, window: str) -> None:
        if kind == "close":  # both marks go into the stream once it has passed the chunk's change
            # Windows read at the same change (nothing written between two chunks) must still
            # order one after the other: each starts where the last one's rows ended. With the
            # same order, a sink holding the first window's end skipped the second one's rows.
            at, last = self.read_at, self.source.last_mark
            if last is not None and last.change_id == at.change_id:
                at = at._replace(after_snapshot=last.after_snapshot)
            self.source.last_mark = at._replace(after_snapshot=at.after_snapshot + 1)
            self.source.snapshot_marks.append((window, at))

    def name_of(self, e: Event) -> str:
        return e.source.table

    def is_signal(self, e: Event) -> bool:
        return e.source.table == MARKS

    def mark_of(self, e: Event) -> tuple[str, str] | None:
        typ = (e.after or {}).get("type")
        if typ not in (OPEN, CLOSE) or e.after is None:
            return None
        return ("open" if typ == OPEN else "close", str(e.after["data"]))

    def signal_of(self, e: Event) -> list[str] | None:
        return None

    def source_info(self, table: TableRef, at: Position, ts_ms: int) -> SourceInfo:
        return SourceInfo(self.source.connector, self.source.db_name, table.name, at, ts_ms, None, table.key)


def marks(window: str, at: TursoPosition, db: str, tenant: str) -> list[Event]:
    """The open and close marks of ``window`` at change ``at`` (its ``after_snapshot`` counts the
    windows before it at that change): the close mark's checkpoint sorts after the rows that
    follow it, and before the next window's."""
    done = at._replace(after_snapshot=at.after_snapshot + 1)
    out = []
    for typ, checkpoint in ((OPEN, at), (CLOSE, done)):
        info = SourceInfo("turso", db, MARKS, at, 0)
        out.append(Event("c", None, {"type": typ, "data": window}, info, "snapshot", True, f"{window}:{typ}",
                         at.order, checkpoint, tenant, 64))  # fmt: skip
    return out
