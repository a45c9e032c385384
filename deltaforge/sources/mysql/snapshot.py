"""MySQL/MariaDB's side of snapshots: chunks with aiomysql, watermarks as signal-table rows.

The signal table (Debezium's shape: ``id``, ``type``, ``data``) is created when missing and
captured like any table; the reader never delivers its rows. A watermark is an upsert of
one of two rows (``type`` ``snapshot-window-open`` / ``snapshot-window-close``, ``data`` the
window's id), so the table stays two rows long. Users may insert Debezium
``execute-snapshot`` rows into it to ask for snapshots from SQL.

The connection's time zone is UTC and TIMESTAMP values are made aware, as the binlog
decoder makes them, so a snapshot row and a change of the same row carry equal values.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import aiomysql
import pymysql
import structlog

from deltaforge.events import Event, Row, SourceInfo
from deltaforge.position import Position
from deltaforge.snapshot.chunks import ChunkReader, SnapshotRefused, answered, debezium_signal, table_changed
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.mysql.checks import is_unavailable
from deltaforge.sources.mysql.json_chunks import JsonChunks
from deltaforge.sources.mysql.names import quote_ident
from deltaforge.sources.mysql.rowvalues import short_float

if TYPE_CHECKING:
    from deltaforge.sources.mysql.source import MySQLSource

T = TypeVar("T")
SYSTEM = ("mysql", "sys", "information_schema", "performance_schema")
OPEN, CLOSE = "snapshot-window-open", "snapshot-window-close"
# ER_BAD_FIELD_ERROR: a chunk query names a column the table no longer has.
UNKNOWN_COLUMN = 1054
# UTC: see the module. group_concat_max_len also bounds JSON_ARRAYAGG (json_chunks): at its
# default, 1 MiB, a chunk of 10,000 rows of 100 bytes would come back cut short.
INIT = "SET time_zone = '+00:00', group_concat_max_len = 4294967295 /*M!, max_statement_time = 0 */"
"""Each chunk connection's session. MariaDB's ``max_statement_time`` (a user's, ``GRANT ... WITH
MAX_STATEMENT_TIME``, or the server's) interrupted a chunk read longer than it, waiting behind a
``LOCK TABLES`` or reading a large chunk, error 1969 at each attempt: the reads are bounded by
``query_timeout_s``, so it is turned off for them, in a comment only MariaDB executes (MySQL's
``max_execution_time`` is not set: not tried against a MySQL server here)."""


class _Table:
    def __init__(self, ref: TableRef, columns: list[dict[str, Any]]) -> None:
        self.ref = ref
        self.definition = _definition(columns)
        self.instants = [c["COLUMN_NAME"] for c in columns if c["DATA_TYPE"] == "timestamp"]
        # A date no calendar has (0000-00-00, 2024-00-00) comes back as its text; the binlog's
        # decoder gives it as None (rowvalues.as_utc), and so does a snapshot.
        self.dates = [
            c["COLUMN_NAME"] for c in columns if c["DATA_TYPE"] in ("date", "datetime", "timestamp")
        ]
        self.floats = [c["COLUMN_NAME"] for c in columns if c["DATA_TYPE"] == "float"]
        db, _, table = ref.name.partition(".")
        target = f"{quote_ident(db)}.{quote_ident(table)}"
        # Every column by name: SELECT * leaves out INVISIBLE ones, which the binlog carries. A
        # FLOAT widened to a DOUBLE, exactly: its own text has six digits (16777215 as 16777200).
        select = ", ".join(
            f"({quote_ident(c['COLUMN_NAME'])} + 0e0) AS {quote_ident(c['COLUMN_NAME'])}"
            if c["DATA_TYPE"] == "float" else quote_ident(c["COLUMN_NAME"])
            for c in columns
        )  # fmt: skip
        keys = ", ".join(quote_ident(k) for k in ref.key)
        marks = ", ".join(["%s"] * len(ref.key))
        after = f" WHERE ({keys}) > ({marks})"
        self.last_key = f"SELECT {keys} FROM {target} ORDER BY {', '.join(f'{quote_ident(k)} DESC' for k in ref.key)} LIMIT 1"
        self.remaining = f"SELECT EXISTS (SELECT 1 FROM {target}{after} AND ({keys}) <= ({marks})) AS found"
        self.first = f"SELECT {select} FROM {target} ORDER BY {keys} LIMIT %s"
        self.after = f"SELECT {select} FROM {target}{after} ORDER BY {keys} LIMIT %s"
        self.json = JsonChunks.of(columns)
        if self.json is not None:
            self.json_first = self.json.query(select, target, "", keys)
            self.json_after = self.json.query(select, target, after, keys)


def _definition(columns: list[dict[str, Any]]) -> tuple[tuple[Any, ...], ...]:
    """What a chunk's queries are built from: each column's name and type, in table order."""
    return tuple(
        (c["COLUMN_NAME"], c["DATA_TYPE"], c["COLUMN_TYPE"], c["CHARACTER_SET_NAME"]) for c in columns
    )


class MySQLChunks(ChunkReader):
    """Chunks and watermarks of a :class:`MySQLSource` (see the module)."""

    def __init__(self, source: MySQLSource, signal_table: str) -> None:
        self.source = source
        self.signal = signal_table
        self.signal_db, _, self.signal_name = signal_table.partition(".")
        self.pool: aiomysql.Pool | None = None
        self.known: dict[str, _Table] = {}
        self.signal_ready = False

    async def _run(self, work: Callable[[aiomysql.Cursor], Awaitable[T]]) -> T:
        if self.pool is None:
            raise RuntimeError("snapshot reader is not open")
        who = f"mysql source {self.source.id!r} ({self.source.settings.where})"
        timeout = self.source.settings.query_timeout_s
        try:
            async with self.pool.acquire() as conn, conn.cursor(aiomysql.DictCursor) as cur:
                return await answered(work(cur), timeout, conn.close, who)
        except Exception as exc:
            if is_unavailable(exc):
                where = self.source.settings.where
                raise SourceUnavailable(
                    f"mysql source {self.source.id!r} ({where}): {type(exc).__name__}: {exc}"
                ) from None
            raise

    async def open(self, parallel: int) -> None:
        s = self.source.settings
        try:
            self.pool = await aiomysql.create_pool(
                host=s.host, port=s.port, user=s.user, password=s.password, autocommit=True,
                minsize=1, maxsize=parallel, connect_timeout=10, init_command=INIT,
            )  # fmt: skip
        except Exception as exc:
            if is_unavailable(exc):
                raise SourceUnavailable(
                    f"mysql source {self.source.id!r}: {type(exc).__name__}: {exc}"
                ) from None
            raise
        self.signal_ready = False

    async def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.terminate()
            await pool.wait_closed()

    async def _ensure_signal_table(self) -> None:
        if self.signal_ready:
            return
        db, _, table = self.signal.partition(".")
        try:
            # Looked up first: CREATE TABLE IF NOT EXISTS of a table there leaves the server's note,
            # which aiomysql raises as a Python warning ("already exists") at every start.
            if not await self._run(lambda cur: _exists(cur, db, table)):
                await self._run(lambda cur: cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {quote_ident(db)}.{quote_ident(table)} "
                    "(id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, data VARCHAR(2048) NULL)"
                ))  # fmt: skip
        except pymysql.err.MySQLError as exc:
            raise SnapshotRefused(
                f"snapshots write watermarks to the signal table {self.signal!r}, and creating it failed "
                f"({exc.args[-1]}): create it, or grant the source's user CREATE, INSERT and UPDATE on it"
            ) from None
        self.signal_ready = True

    async def prepare(self) -> str | None:
        try:
            await self._ensure_signal_table()
        except SnapshotRefused as exc:
            return exc.reason
        return None

    async def tables(self, names: list[str] | None) -> list[TableRef]:
        await self._ensure_signal_table()
        rows = await self._run(self._catalog)
        captured: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            name = f"{r['TABLE_SCHEMA']}.{r['TABLE_NAME']}"
            if name != self.signal and self.source.captures(r["TABLE_SCHEMA"], r["TABLE_NAME"]):
                captured.setdefault(name, []).append(r)
        out = []
        info = self.source.info
        if names and info is not None and info.names_fold_case:  # stored, and read, in lower case
            names = [n.lower() for n in names]
        for name in names or sorted(captured):
            cols = captured.get(name)
            if cols is None:
                raise SnapshotRefused(f"snapshot of {name!r}: no such table among the captured ones "
                                      f"({', '.join(sorted(captured)) or 'none'})")  # fmt: skip
            key = tuple(
                c["COLUMN_NAME"] for c in sorted((c for c in cols if c["KEY_AT"]), key=lambda c: c["KEY_AT"])
            )
            if cols[0]["TABLE_TYPE"] == "SYSTEM VERSIONED":
                # Its rows' versions stream each under its own key (the primary key and row_end,
                # as the binlog has it); the catalogue lists neither row_start nor row_end.
                raise SnapshotRefused(
                    f"snapshot of {name!r}: the table is system-versioned (WITH SYSTEM VERSIONING): its changes "
                    "stream with every row version keyed by its primary key and row_end, and snapshots do not "
                    "read row versions yet; leave the table out of snapshot.tables"
                )
            if not key:
                raise SnapshotRefused(
                    f"snapshot of {name!r}: the table has no primary key, and snapshots read tables in "
                    "primary-key ranges; add a primary key, or leave the table out of snapshot.tables"
                )
            ref = TableRef(name, key)
            self.known[name] = _Table(ref, cols)
            out.append(ref)
        return out

    @staticmethod
    async def _catalog(cur: aiomysql.Cursor) -> list[dict[str, Any]]:
        await cur.execute(
            "SELECT c.TABLE_SCHEMA, c.TABLE_NAME, c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.CHARACTER_SET_NAME, "
            "COALESCE(k.ORDINAL_POSITION, 0) AS KEY_AT, t.TABLE_TYPE "
            "FROM information_schema.COLUMNS c JOIN information_schema.TABLES t "
            "ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME "
            "AND t.TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') "
            "LEFT JOIN information_schema.KEY_COLUMN_USAGE k ON k.TABLE_SCHEMA = c.TABLE_SCHEMA "
            "AND k.TABLE_NAME = c.TABLE_NAME AND k.COLUMN_NAME = c.COLUMN_NAME AND k.CONSTRAINT_NAME = 'PRIMARY' "
            f"WHERE c.TABLE_SCHEMA NOT IN {SYSTEM!r} ORDER BY c.TABLE_SCHEMA, c.TABLE_NAME, c.ORDINAL_POSITION"
        )
        return list(await cur.fetchall())

    @staticmethod
    async def _columns(cur: aiomysql.Cursor, table: str) -> list[dict[str, Any]]:
        """``table``'s columns as the catalog has them now, in table order: what its chunk
        queries are built from. Named by schema and table, so MariaDB opens only that table's
        definition (with the catalog's joins it took 12 ms, a tenth of a 10,000-row chunk)."""
        db, _, name = table.partition(".")
        await cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (db, name),
        )
        return list(await cur.fetchall())

    async def estimate(self, table: TableRef) -> int:
        db, _, name = table.name.partition(".")

        async def read(cur: aiomysql.Cursor) -> int:
            await cur.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (db, name),
            )
            found = await cur.fetchone()
            return int((found or {}).get("TABLE_ROWS") or 0)

        return await self._run(read)

    bounded = True

    async def last_key(self, table: TableRef) -> list[Any] | None:
        async def read(cur: aiomysql.Cursor) -> list[Any] | None:
            await cur.execute(self.known[table.name].last_key)
            row = await cur.fetchone()
            return None if row is None else [_json_key(row[k]) for k in table.key]

        return await self._run(read)

    async def remaining(self, table: TableRef, after: list[Any], bound: list[Any]) -> bool:
        async def read(cur: aiomysql.Cursor) -> bool:
            await cur.execute(self.known[table.name].remaining, (*after, *bound))
            row = await cur.fetchone()
            return bool(row and row["found"])

        return await self._run(read)

    async def chunk(
        self, table: TableRef, after: list[Any] | None, limit: int
    ) -> tuple[list[Row], list[Any] | None, bool]:
        args = (limit + 1,) if after is None else (*after, limit + 1)

        async def read(cur: aiomysql.Cursor) -> tuple[_Table, list[Row]]:
            # The chunk, then the table's columns, in one transaction: the read holds the
            # table's metadata lock until COMMIT, so no ALTER lands in between and the columns
            # are those the chunk was read with. A column added since the queries were built
            # (or dropped) means building them again and reading the chunk again.
            while True:
                t = self.known[table.name]
                await cur.execute("START TRANSACTION READ ONLY")
                try:
                    rows: list[Row] | None = await self._rows(cur, t, after is None, args)
                    failure = None
                except pymysql.err.MySQLError as exc:
                    if exc.args[0] != UNKNOWN_COLUMN:
                        raise
                    rows, failure = None, exc
                columns = await self._columns(cur, table.name)
                await cur.execute("COMMIT")
                if _definition(columns) == t.definition:
                    if failure is not None:  # not a column change (a renamed key column): no rebuild helps
                        raise failure
                    if rows is not None:
                        return t, rows
                table_changed(self.source.id, table.name, [c["COLUMN_NAME"] for c in columns])
                changed = _Table(table, columns)
                if t.json is None:  # it was read plainly for a reason that may still hold
                    changed.json = None
                self.known[table.name] = changed

        t, rows = await self._run(read)
        more = len(rows) > limit
        rows = rows[:limit]
        if not rows:
            return [], after, False
        for name in t.instants:
            for r in rows:
                v = r.get(name)
                if isinstance(v, datetime):
                    r[name] = v.replace(tzinfo=UTC)
        for name in t.dates:
            for r in rows:
                if isinstance(r.get(name), str):
                    r[name] = None
        for name in t.floats:  # as the binlog's decoder gives them (rowvalues.Retyped)
            for r in rows:
                v = r.get(name)
                if isinstance(v, float):
                    r[name] = short_float(v)
        return rows, [_json_key(rows[-1][k]) for k in table.key], more

    async def _rows(self, cur: aiomysql.Cursor, t: _Table, first: bool, args: tuple[Any, ...]) -> list[Row]:
        if t.json is not None:
            try:
                await cur.execute(t.json_first if first else t.json_after, args)
                got = await cur.fetchone()
                rows = t.json.rows(int(got["n"]), got["doc"])
                why = "not all of the chunk came back"
            except pymysql.err.MySQLError as exc:
                if is_unavailable(exc) or exc.args[0] == UNKNOWN_COLUMN:
                    raise
                # MySQL 8, say: its JSON_ARRAYAGG takes no ORDER BY.
                rows, why = None, f"the server refused the JSON read: {exc.args[-1]}"
            if rows is not None:
                return rows
            # Read it the plain way, and the table's next chunks too.
            structlog.get_logger().warning(
                "snapshot_chunk_read_plainly", actor="snapshot", source=self.source.id,
                table=t.ref.name, reason=why,
            )  # fmt: skip
            t.json = None
        await cur.execute(t.first if first else t.after, args)
        return list(await cur.fetchall())

    async def watermark(self, kind: str, window: str) -> None:
        db, _, table = self.signal.partition(".")
        typ = OPEN if kind == "open" else CLOSE
        await self._run(lambda cur: cur.execute(
            f"INSERT INTO {quote_ident(db)}.{quote_ident(table)} (id, type, data) VALUES (%s, %s, %s) "
            "ON DUPLICATE KEY UPDATE data = VALUES(data)", (f"deltaforge-{kind}", typ, window),
        ))  # fmt: skip

    def name_of(self, e: Event) -> str:
        return f"{e.source.db}.{e.source.table}"

    def is_signal(self, e: Event) -> bool:
        # Asked of every event read: compare the parts, no string built.
        return e.source.table == self.signal_name and e.source.db == self.signal_db and e.op != "h"

    def mark_of(self, e: Event) -> tuple[str, str] | None:
        row = e.after
        if row is None or e.op not in ("c", "u"):
            return None
        typ = row.get("type")
        if typ in (OPEN, CLOSE):
            return ("open" if typ == OPEN else "close", str(row.get("data")))
        return None

    def signal_of(self, e: Event) -> list[str] | None:
        return debezium_signal(e)

    def source_info(self, table: TableRef, at: Position, ts_ms: int) -> SourceInfo:
        db, _, name = table.name.partition(".")
        return SourceInfo(self.source.connector, db, name, at, ts_ms, None, table.key)


def _json_key(value: Any) -> Any:
    """A key value as the progress stores it (JSON); aiomysql takes it back as a parameter."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, int | str | float) or value is None:
        return value
    return str(value)


async def _exists(cur: aiomysql.Cursor, db: str, table: str) -> bool:
    await cur.execute(
        "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (db, table)
    )
    return bool(await cur.fetchall())
