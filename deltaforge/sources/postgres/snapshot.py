"""PostgreSQL's side of snapshots: chunks with asyncpg, watermarks as logical messages.

Watermarks are ``pg_logical_emit_message(true, 'deltaforge.snapshot', 'open:<id>')``:
transactional, so they sit in the commit order every change is read in, and they need no
table. Chunk rows are selected as text and converted by the same functions pgoutput values
go through (with the decoder's session settings), so a snapshot row and a change of the
same row carry equal values.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import structlog

from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event, Row, SourceInfo
from deltaforge.position import Position
from deltaforge.redact import redact
from deltaforge.snapshot.chunks import (
    WATERMARK_PREFIX,
    ChunkReader,
    SnapshotRefused,
    answered,
    debezium_signal,
    rows_of,
    table_changed,
)
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import SourceUnavailable, unanswered
from deltaforge.sources.postgres.errors import describe, is_unavailable
from deltaforge.sources.postgres.names import PRIMARY_KEY, qualified, quote_ident, quote_table
from deltaforge.sources.postgres.values import OWN_BOUNDS, SESSION, TYPES, Types

if TYPE_CHECKING:
    from deltaforge.sources.postgres.source import PostgresSource

T = TypeVar("T")

_COLUMNS = (
    "SELECT attname, atttypid::bigint, format_type(atttypid, atttypmod) FROM pg_attribute "
    "WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND ($2 OR attgenerated = '') ORDER BY attnum"
)
Backend = tuple[int, str]
"""A server process: its pid and ``backend_start`` as the server writes it."""

_STARTED = "SELECT backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
_END_GIVEN_UP = (
    "SELECT a.pid, a.backend_start::text, pg_terminate_backend(a.pid) FROM pg_stat_activity a "
    "JOIN unnest($1::int[], $2::text[]) g(pid, since) ON a.pid = g.pid AND a.backend_start::text = g.since"
)
"""Signals the given-up reads' backends still there (by pid and start: a pid alone may be another
backend's by then), one row each."""
_PRIMARY_KEY = PRIMARY_KEY.replace("%s", "$1")
_TYPES = TYPES.replace("%s", "$1")


async def _columns_of(
    conn: asyncpg.Connection, oid: int, generated: bool = True
) -> list[tuple[str, int, str]]:
    """A table's columns (name, type oid, declared type), in table order; generated ones only
    with ``generated``."""
    return [(str(r[0]), int(r[1]), str(r[2])) for r in await conn.fetch(_COLUMNS, oid, generated)]


NATIVE = {16, 20, 21, 23, 25, 1043}
"""bool, int8, int2, int4, text, varchar: asyncpg decodes these to exactly what pgoutput's text
conversion gives, without the text round trip (a third of a chunk's cost)."""


BPCHAR = 1042


def _as_text(column: str, oid: int) -> str:
    """A column as pgoutput's text has it: its type's output function. A cast to text is that,
    but for ``char(n)`` (``oid``: a domain's base type), whose cast drops the padding its output
    keeps (``'ab   '``)."""
    return f"textin(bpcharout({column}))" if oid == BPCHAR else f"{column}::text"


_SHAPE = "SELECT attnames, rowfilter FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3"
"""PostgreSQL 15: the columns (its column list, else all) and rows (its row filter) a publication
publishes of a table; pgoutput sends only those, so a snapshot reads only those."""

Shape = tuple[list[tuple[str, int, str]], str | None]
"""The columns a snapshot reads of a table (name, type oid, declared type; in table order), and
the row filter it applies (SQL, or None)."""


class _Table:
    """How one table is read: its select, and its columns' converters."""

    def __init__(self, ref: TableRef, oid: int, shape: Shape, types: Types) -> None:
        self.ref, self.oid, self.shape = ref, oid, shape
        columns, where = shape
        self.columns = columns
        self.names = [c[0] for c in columns]
        self.convs = [None if c[1] in NATIVE or (f := types.converter(c[1])) is str else f for c in columns]
        self.rows = rows_of(self.names, self.convs)
        key_types = {c[0]: c[2] for c in columns}
        self.key_at = [self.names.index(k) for k in ref.key]
        schema, _, table = ref.name.partition(".")
        self.target = target = f"{quote_ident(schema)}.{quote_ident(table)}"
        cols = ", ".join(
            quote_ident(c[0])
            if c[1] in NATIVE
            else f"{_as_text(quote_ident(c[0]), types.base(c[1]))} AS {quote_ident(c[0])}"
            for c in columns
        )
        # Qualified: ORDER BY a bare name would sort by the output column, the text cast.
        keys = ", ".join(f"t.{quote_ident(k)}" for k in ref.key)
        params = ", ".join(f"${i + 1}::text::{key_types[k]}" for i, k in enumerate(ref.key))
        n = len(ref.key)
        bound = ", ".join(f"${n + i + 1}::text::{key_types[k]}" for i, k in enumerate(ref.key))
        # The row filter as the publication has it: bare column names, which name the table's
        # columns in a WHERE clause (the select list's text casts are seen by ORDER BY only).
        also, only = (f" AND ({where})", f" WHERE ({where})") if where else ("", "")
        self.last_key = (
            f"SELECT {', '.join(f't.{quote_ident(k)}::text' for k in ref.key)} FROM {target} t{only} "
            f"ORDER BY {', '.join(f't.{quote_ident(k)} DESC' for k in ref.key)} LIMIT 1"
        )
        self.remaining = f"SELECT EXISTS (SELECT 1 FROM {target} t WHERE ({keys}) > ({params}) AND ({keys}) <= ({bound}){also})"
        self.first = f"SELECT {cols} FROM {target} t{only} ORDER BY {keys} LIMIT $1"
        self.after = f"SELECT {cols} FROM {target} t WHERE ({keys}) > ({params}){also} ORDER BY {keys} LIMIT ${len(ref.key) + 1}"


class PostgresChunks(ChunkReader):
    """Chunks and watermarks of a :class:`PostgresSource` (see the module)."""

    def __init__(self, source: PostgresSource, settings: SnapshotSettings) -> None:
        self.source = source
        self.signal = qualified(settings.signal_table) if settings.signal_table else None
        self.pool: asyncpg.Pool | None = None
        self.known: dict[str, _Table] = {}
        self.types = Types()
        self.backends: dict[int, Backend] = {}  # each pooled connection's backend, by its pid

    async def _shape(self, conn: asyncpg.Connection, oid: int, name: str) -> Shape:
        """What of table ``name`` (its ``oid``) the publication publishes now (see :data:`Shape`)."""
        version = conn.get_server_version().major
        # pgoutput leaves generated columns out of every change before PostgreSQL 18 (from 18 on
        # the publication says, and its column names below follow it); a snapshot row carrying
        # one would hold a value no later change of the row updates.
        columns = await _columns_of(conn, oid, generated=version >= 18)
        while need := self.types.missing(c[1] for c in columns):  # domains and arrays, as the stream
            self.types.learn(need, await conn.fetch(_TYPES, need))
        if version < 15 or not columns:  # row filters and column lists: PostgreSQL 15
            return columns, None
        schema, _, table = name.partition(".")
        found = await conn.fetchrow(_SHAPE, self.source.publication, schema, table)
        if found is None:
            raise SnapshotRefused(
                f"snapshot of {name!r}: the table is no longer in publication {self.source.publication!r}"
            )
        published = set(found[0] or ())
        return [c for c in columns if c[0] in published], found[1]

    async def _run(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``work`` on a pooled connection; a server that went away is unavailable, not an error."""
        if self.pool is None:
            raise RuntimeError("snapshot reader is not open")
        who, timeout = self.source.who, self.source.query_timeout
        try:
            conn = await self.pool.acquire()
            backend = self.backends.get(conn.get_server_pid())

            def give_up() -> None:
                conn.terminate()
                self._given_up(backend)

            try:
                return await answered(self._after_given_up(conn, work), timeout, give_up, who)
            finally:
                # The pool's release resets the connection with a query of its own, unbounded
                # unless told: on a connection gone silent just after the answer, the snapshot
                # waited on it for ever. Past the timeout asyncpg ends the connection itself.
                try:
                    await self.pool.release(conn, timeout=timeout)
                except TimeoutError:
                    self._given_up(backend)
                    raise unanswered(who, timeout) from None
        except Exception as exc:
            if is_unavailable(exc):
                raise SourceUnavailable(f"{who}: {describe(exc, self.source.dsn)}") from None
            raise

    def _given_up(self, backend: Backend | None) -> None:
        """A read's connection dropped without a word to the server: a silent connection. Its
        backend, blocked sending the chunk into a socket nobody reads, keeps its transaction, and
        with it the xmin horizon every vacuum of the database waits on, until TCP gives the
        connection up: about 15 minutes for a vanished host, never for a peer alive but not
        reading. The next read ends it."""
        if backend is not None:
            self.source.given_up.setdefault(backend, 0)

    async def _after_given_up(
        self, conn: asyncpg.Connection, work: Callable[[asyncpg.Connection], Awaitable[T]]
    ) -> T:
        """``work``, after ending the backends of reads given up that are still there (signalled
        again at each read until they are gone)."""
        given_up = self.source.given_up
        if given_up:
            pids, starts = zip(*given_up, strict=True)
            log = structlog.get_logger().bind(actor="PostgresSource", source=self.source.who)
            try:
                there = {(int(r[0]), str(r[1])) for r in await conn.fetch(_END_GIVEN_UP, pids, starts)}
            except asyncpg.InsufficientPrivilegeError as exc:  # then the server's own timeouts
                log.warning(
                    "snapshot_read_left", pids=list(pids), reason=redact(f"{type(exc).__name__}: {exc}")
                )
                there = set()
            for backend in list(given_up):
                if backend not in there:
                    del given_up[backend]
                    continue
                if not given_up[backend]:
                    log.warning(
                        "snapshot_read_ended", pid=backend[0],
                        reason="the backend of a chunk read given up for not answering was still there, "
                        "holding its transaction (and vacuum's horizon): its connection went silent",
                    )  # fmt: skip
                given_up[backend] += 1
        return await work(conn)

    async def _met(self, conn: asyncpg.Connection) -> None:
        """A new pooled connection: its backend's start, which with its pid names it (``_given_up``)."""
        started = await conn.fetchval(_STARTED, timeout=self.source.query_timeout)
        self.backends[conn.get_server_pid()] = (conn.get_server_pid(), str(started))

    async def open(self, parallel: int) -> None:
        try:
            self.pool = await asyncpg.create_pool(
                self.source.dsn,
                min_size=1,
                max_size=parallel,
                timeout=10,
                server_settings={**SESSION, **OWN_BOUNDS},
                init=self._met,
            )
        except Exception as exc:
            if is_unavailable(exc):
                raise SourceUnavailable(f"{self.source.who}: {describe(exc, self.source.dsn)}") from None
            raise

    async def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.terminate()

    async def tables(self, names: list[str] | None) -> list[TableRef]:
        return await self._run(lambda conn: self._tables(conn, names))

    async def _tables(self, conn: asyncpg.Connection, names: list[str] | None) -> list[TableRef]:
        published = [
            f"{r[0]}.{r[1]}"
            for r in await conn.fetch(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2",
                self.source.publication,
            )
        ]
        wanted = [qualified(n) for n in names] if names else [t for t in published if t != self.signal]
        out = []
        for name in wanted:
            if name not in published:
                raise SnapshotRefused(
                    f"snapshot of {name!r}: no such table in publication {self.source.publication!r} "
                    f"(it has {', '.join(published) or 'none'})"
                )
            oid = await conn.fetchval("SELECT to_regclass($1)::oid::bigint", quote_table(name))
            shape = await self._shape(conn, oid, name)
            key = tuple(str(r[0]) for r in await conn.fetch(_PRIMARY_KEY, oid))
            if not key:
                raise SnapshotRefused(
                    f"snapshot of {name!r}: the table has no primary key, and snapshots read tables in "
                    "primary-key ranges; add a primary key, or leave the table out of snapshot.tables"
                )
            left_out = [k for k in key if k not in {c[0] for c in shape[0]}]
            if left_out:
                raise SnapshotRefused(
                    f"snapshot of {name!r}: publication {self.source.publication!r} leaves key column(s) "
                    f"{', '.join(left_out)} out of its column list, and snapshot rows are read and delivered "
                    "by their key; add them to the column list"
                )
            ref = TableRef(name, key)
            self.known[name] = _Table(ref, int(oid), shape, self.types)
            out.append(ref)
        return out

    async def estimate(self, table: TableRef) -> int:
        # The planner's estimate, not pg_class.reltuples: that is -1 for a table never analyzed
        # (a table loaded just before its snapshot) and stale for one grown since; the planner
        # scales it to the table's size now (and sums a partitioned table's partitions).
        explain = f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {self.known[table.name].target}"
        found = await self._run(lambda conn: conn.fetchval(explain))
        return max(int(json.loads(found)[0]["Plan"]["Plan Rows"]), 0)

    bounded = True

    async def last_key(self, table: TableRef) -> list[Any] | None:
        sql = self.known[table.name].last_key
        row = await self._run(lambda conn: conn.fetchrow(sql))
        return None if row is None else [str(v) for v in row]

    async def remaining(self, table: TableRef, after: list[Any], bound: list[Any]) -> bool:
        sql = self.known[table.name].remaining
        return bool(await self._run(lambda conn: conn.fetchval(sql, *after, *bound)))

    async def chunk(
        self, table: TableRef, after: list[Any] | None, limit: int
    ) -> tuple[list[Row], list[Any] | None, bool]:
        async def read(conn: asyncpg.Connection) -> tuple[_Table, list[asyncpg.Record]]:
            # The chunk, then the table's columns, in one transaction: the read's lock keeps any
            # ALTER TABLE out until it ends, so the columns are those the chunk was read with. A
            # column added since the query was built (or dropped) means building it again and
            # reading the chunk again: the query names its columns.
            while True:
                t = self.known[table.name]
                # BEGIN and COMMIT as statements, not conn.transaction(): when the connection is
                # lost mid-chunk, its __aexit__ tried a ROLLBACK and raised InterfaceError in place
                # of the lost connection's error, and the pipeline failed instead of waiting (the
                # chaos scenario snapshot_outage). The pool rolls back whatever is left open.
                records: list[asyncpg.Record] | None
                failure: asyncpg.UndefinedColumnError | None = None
                await conn.execute("BEGIN READ ONLY")
                try:
                    if after is None:
                        records = await conn.fetch(t.first, limit + 1)
                    else:
                        records = await conn.fetch(t.after, *after, limit + 1)
                except asyncpg.UndefinedColumnError as exc:
                    await conn.execute("ROLLBACK")
                    records, failure, shape = None, exc, await self._shape(conn, t.oid, table.name)
                else:
                    shape = await self._shape(conn, t.oid, table.name)
                    await conn.execute("COMMIT")
                columns = shape[0]
                if shape == t.shape or not set(table.key) <= {c[0] for c in columns}:
                    if failure is not None:  # a renamed key column, say: no rebuild helps
                        raise failure
                    if records is not None:
                        return t, records
                table_changed(self.source.id, table.name, [c[0] for c in columns])
                self.known[table.name] = _Table(table, t.oid, shape, self.types)

        t, records = await self._run(read)
        more = len(records) > limit
        records = records[:limit]
        if not records:
            return [], after, False
        return (
            t.rows(records),
            [v if isinstance(v, str) else str(v) for v in (records[-1][i] for i in t.key_at)],
            more,
        )

    async def watermark(self, kind: str, window: str) -> None:
        await self._run(
            lambda conn: conn.execute(
                "SELECT pg_logical_emit_message(true, $1, $2)", WATERMARK_PREFIX, f"{kind}:{window}"
            )
        )

    def name_of(self, e: Event) -> str:
        return f"{e.source.schema}.{e.source.table}"

    def is_signal(self, e: Event) -> bool:
        return e.op == "m" or (self.signal is not None and self.name_of(e) == self.signal)

    def mark_of(self, e: Event) -> tuple[str, str] | None:
        if e.op != "m" or e.after is None:
            return None
        kind, _, window = str(e.after.get("content", "")).partition(":")
        return (kind, window) if kind in ("open", "close") else None

    def signal_of(self, e: Event) -> list[str] | None:
        return debezium_signal(e)

    def source_info(self, table: TableRef, at: Position, ts_ms: int) -> SourceInfo:
        schema, _, name = table.name.partition(".")
        return SourceInfo(self.source.connector, self.source.db, name, at, ts_ms, schema, table.key)
