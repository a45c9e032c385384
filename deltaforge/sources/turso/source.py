"""Turso source: reads the ``turso_cdc`` table after the checkpointed change_id.

Writes land in ``turso_cdc`` only from connections that ran
``PRAGMA unstable_capture_data_changes_conn('full')``. Each transaction ends
with a commit marker row (change_type 2); events are held back until their
marker is read, so the last event of a transaction carries ``tx_end`` and the
marker's change_id as its checkpoint (a resume then starts after the marker).
A transaction larger than a read goes on in pieces before its marker (its rows
are visible only once it has committed), so none is held whole.

pyturso locks the database file per process: the application writing it must
run inside this service's process (see ``workload.py``) or stop while it runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import structlog

from actors import BlockingRunner
from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event, SourceInfo
from deltaforge.position import Position, PositionDoc
from deltaforge.snapshot.chunks import ChunkReader
from deltaforge.sources.base import (
    DeclaredTable,
    PositionLost,
    SchemaChange,
    Source,
    SourceError,
    SourceMisconfigured,
    own_position,
)
from deltaforge.sources.turso.captured import CapturedNames, name_dropped
from deltaforge.sources.turso.cdcids import ids_went_back
from deltaforge.sources.turso.config import TursoSourceConfig
from deltaforge.sources.turso.opening import check_position, connect
from deltaforge.sources.turso.position import TursoPosition
from deltaforge.sources.turso.record import decode_record, quote_name, table_info

_OPS = {1: "c", 0: "u", -1: "d"}
_NAMES = {1: "insert", 0: "update", -1: "delete"}
new_position = tuple.__new__  # a NamedTuple without its Python-level __new__: one per event
_COMMIT = 2
_SCHEMA_TABLE = "sqlite_schema"


class TursoSource(Source):
    """Change events from an embedded Turso database file."""

    connector = "turso"

    def __init__(self, config: TursoSourceConfig, tenant: str = "default") -> None:
        self.id = config.id
        self.path = config.path
        self.db_name = Path(self.path).stem
        self.tables: set[str] | None = set(config.tables) if config.tables else None
        self.names = CapturedNames(self.id, self.tables) if self.tables is not None else None
        self.chunk = config.read_chunk
        self._idle = config.poll_interval_ms / 1000
        self.tenant = tenant
        self._conn: Any = None
        self._after = 0
        self._after_tx: tuple[int, int] | None = None  # the last change read's transaction and time
        self._resume: TursoPosition | None = None
        self._columns: dict[str, tuple[list[str], int | None]] = {}
        self._decode_at = 0  # the change_id of the transaction being decoded
        self._keys: dict[str, tuple[str, ...]] = {}  # a table's primary-key columns
        self._pending: list[tuple[Any, ...]] = []
        self._schema_changes: list[SchemaChange] = []
        self._more = False  # the last read stopped at its LIMIT
        self._threads = BlockingRunner(1)
        self._has_cdc_table = False
        self.snapshot_marks: list[tuple[str, TursoPosition]] = []
        """Snapshot windows to mark in the stream once it has passed their change (TursoChunks)."""
        self.last_mark: TursoPosition | None = None
        """Where the newest window's rows end (or the resume position): windows at one change
        count up its ``after_snapshot``."""

    def chunk_reader(self, settings: SnapshotSettings) -> ChunkReader:
        from deltaforge.sources.turso.snapshot import TursoChunks

        return TursoChunks(self)

    def connection(self) -> Any:
        """The reading connection (in this source's worker thread only)."""
        if self._conn is None:
            raise SourceError(f"turso source {self.id!r} is not open")
        return self._conn

    @staticmethod
    def load_position(doc: PositionDoc) -> TursoPosition:
        return TursoPosition.from_doc(doc)

    @property
    def idle_wait(self) -> float:
        return self._idle

    async def open(self, resume_after: Position | None) -> None:
        resume = own_position(resume_after, TursoPosition)
        self.snapshot_marks = []
        self.last_mark = resume
        self._after = resume.change_id if resume else 0
        self.resets = max(self.resets, resume.resets if resume else 0)  # a store that lost the count
        self._after_tx = (resume.txn, int(resume.at or 0)) if resume and resume.txn is not None else None
        self._resume = resume
        self._pending = []
        self._columns = {}
        self._has_cdc_table = False
        self._conn = await self._threads.run(self._connect)
        await self._threads.run(self._name_unmatched)
        if self.names is not None:
            self.names.pages, self.names.next_look = {}, 0.0
            await self._threads.run(self.names.look, self._conn)  # the names as they are now
        if self._resume is not None and self._after:
            await self._threads.run(self._check_position, self._resume)

    async def describe_tables(self) -> list[DeclaredTable]:
        return await self._threads.run(self._describe_sync)

    def _describe_sync(self) -> list[DeclaredTable]:
        conn = self._connect()
        try:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '__turso_internal%' AND name NOT LIKE 'turso_cdc%' "
                    "ORDER BY name"
                ).fetchall()
            ]
            out = []
            for name in names:
                if self.tables is None or name in self.tables:
                    info = conn.execute(f"PRAGMA table_info({quote_name(name)})").fetchall()
                    out.append(DeclaredTable(self.db_name, name, tuple((r[1], str(r[2])) for r in info)))
            conn.commit()
            return out
        finally:
            conn.close()

    async def filled(self, table: str, columns: list[str]) -> list[str]:
        def ask() -> list[str]:
            info = self._conn.execute(f"PRAGMA table_info({quote_name(table)})").fetchall()
            self._conn.commit()
            have = {r[1] for r in info if r[3] or r[4] is not None}  # NOT NULL, or a default
            return [c for c in columns if c in have]

        return await self._threads.run(ask)

    def take_schema_changes(self) -> list[SchemaChange]:
        changes, self._schema_changes = self._schema_changes, []
        return changes

    def _name_unmatched(self) -> None:
        """Log the names in ``tables`` no table has now. Capture goes by name, so a table created
        later is captured from then on; but a misspelt name captures nothing, and nothing else
        would say so."""
        if self.tables is None:
            return
        found = {
            r[0] for r in self._conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
        }
        self._conn.commit()
        if missing := sorted(self.tables - found):
            structlog.get_logger().warning(
                "captured_tables_not_found", actor="TursoSource", tables=missing,
                reason="no table has these names from tables: their changes are captured once such a table "
                "exists, but a misspelt name captures nothing",
            )  # fmt: skip

    def _check_position(self, resume: TursoPosition) -> None:
        check_position(
            self._conn, self.path, resume, f"checkpoint change_id {resume.change_id} of source {self.id!r}"
        )

    def _connect(self) -> Any:
        return connect(self.path, f"turso source {self.id!r}")

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._threads.run(conn.close)

    async def read(self) -> list[Event]:
        if self._conn is None:
            raise SourceError(f"turso source {self.id!r} is not open")
        events = await self._threads.run(self._read_sync)
        return self._marked(events) if self.snapshot_marks else events

    def caught_up(self) -> bool:
        return not self._more  # the last query filled its LIMIT: more rows are there

    def _marked(self, events: list[Event]) -> list[Event]:
        """``events`` with the marks of every snapshot window whose change the stream has passed,
        each after the events at or before that change."""
        from deltaforge.sources.turso.snapshot import marks

        due = [(w, at) for w, at in self.snapshot_marks if at.change_id <= self._after]
        if not due:
            return events
        self.snapshot_marks = [m for m in self.snapshot_marks if m not in due]
        out: list[Event] = []
        i = 0
        for window, at in due:
            while i < len(events) and events[i].order <= at.order:
                out.append(events[i])
                i += 1
            out += marks(window, at, self.db_name, self.tenant)
        return out + events[i:]

    def _read_sync(self) -> list[Event]:
        if not self._has_cdc_table:
            # Turso creates turso_cdc on the first captured write; until then there is nothing.
            found = self._conn.execute(
                "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'turso_cdc'"
            ).fetchall()
            self._conn.commit()
            if not found:
                return []
            self._has_cdc_table = True
        if (why := ids_went_back(self._conn, self._after, self._after_tx)) is not None:
            raise PositionLost(why)
        if self.names is not None:
            self.names.look(self._conn)
        out: list[Event] = []
        while True:
            cursor = self._pending[-1][0] if self._pending else self._after
            rows = self._conn.execute(
                "SELECT change_id, change_time, change_txn_id, change_type, table_name, id, before, after "
                "FROM turso_cdc WHERE change_id > ? ORDER BY change_id LIMIT ?",
                (cursor, self.chunk),
            ).fetchall()
            self._conn.commit()  # end the read transaction so the next read sees new commits
            tx: list[tuple[Any, ...]] = self._pending
            for row in rows:
                if row[3] == _COMMIT:
                    if not self._take(out, tx, row):
                        return out
                    tx = []
                    self._after, self._after_tx = row[0], (row[2], row[1])
                else:
                    tx.append(row)
            if len(tx) > self.chunk:
                # A transaction larger than a read goes on in pieces, not held to its marker: its
                # rows are visible only once it has committed, so a piece is final. The last row
                # waits for the piece that ends it.
                if not self._take(out, tx[:-1], None):
                    return out
                tx = tx[-1:]
            self._pending = tx
            self._more = len(rows) == self.chunk
            # A transaction larger than a chunk: keep reading rather than report "idle".
            if out or len(rows) < self.chunk:
                return out

    def _take(self, out: list[Event], tx: list[tuple[Any, ...]], marker: tuple[Any, ...] | None) -> bool:
        """``tx``'s events onto ``out`` (see :meth:`_events`); False when one of them halts the source
        after what ``out`` holds: those are handed over first, and the halt then stops right at it."""
        try:
            out.extend(self._events(tx, marker))
        except SourceMisconfigured:
            if not out:
                raise
            self._pending, self._more = [], True
            return False
        return True

    def _events(self, tx: list[tuple[Any, ...]], marker: tuple[Any, ...] | None) -> list[Event]:
        """The events of ``tx``, a transaction ended by its commit ``marker``, or (None) a piece of
        one still being read: it ends nothing."""
        changes = [r for r in tx if r[4] != _SCHEMA_TABLE]
        if len(changes) != len(tx):
            self._columns.clear()  # DDL in this transaction: reload column lists
            name_dropped(self.id, self.tables, [r for r in tx if r[4] == _SCHEMA_TABLE])
        self._decode_at = marker[0] if marker is not None else tx[-1][0]
        if self.tables is not None:
            changes = [r for r in changes if r[4] in self.tables]
        events: list[Event] = []
        last = len(changes) - 1 if marker is not None else -1
        resets = self.resets
        for i, (change_id, change_time, txn_id, change_type, table, rowid, before, after) in enumerate(
            changes
        ):
            end = i == last
            if change_type == 1 and after is None and before is not None:
                # pyturso 0.8.3 logs a rowid change as a delete and an insert whose new row is in
                # the *before* column: an insert has no before image, so that is its after image.
                before, after = None, before
            if (change_type != -1 and after is None) or (change_type != 1 and before is None):
                image = "before" if change_type != 1 and before is None else "after"
                raise SourceMisconfigured(
                    f"turso source {self.id!r}: change {change_id} ({_NAMES[change_type]} on {table!r}, "
                    f"transaction {txn_id}) has no {image} image: the "
                    "connection that wrote it captured changes in a mode other than 'full'. Run PRAGMA "
                    "unstable_capture_data_changes_conn('full') on every connection that writes, then "
                    "re-snapshot the table from a position after it"
                )
            position = new_position(TursoPosition, (change_id, txn_id, change_time, 0, resets))
            events.append(
                Event(
                    op=_OPS[change_type],
                    before=self._row(table, before, rowid),
                    after=self._row(table, after, rowid),
                    source=SourceInfo(
                        connector=self.connector,
                        db=self.db_name,
                        table=table,
                        position=position,
                        ts_ms=int(change_time) * 1000 if change_time else int(time.time() * 1000),
                        key=self._keys.get(table, ()),
                    ),
                    tx_id=str(txn_id),
                    tx_end=end,
                    event_id=f"r{resets}:{change_id}" if resets else str(change_id),
                    order=(change_id, 0) if not resets else position.order,  # its order, without a call
                    checkpoint=new_position(TursoPosition, (marker[0], marker[2], marker[1], 0, resets))
                    if end and marker is not None
                    else position,
                    tenant=self.tenant,
                    size=96 + len(before or b"") + len(after or b""),
                )
            )
        return events

    def _row(self, table: str, blob: bytes | None, rowid: Any) -> dict[str, Any] | None:
        if blob is None:
            return None
        names, alias = self._table_columns(table)
        values = decode_record(blob)
        if len(values) > len(names):
            # More values than the table has columns: its columns changed with no DDL row in
            # turso_cdc (Turso logs no ALTER TABLE ... RENAME: another table renamed to this
            # name). zip() would drop the values past the known names in silence.
            self._columns.pop(table, None)
            names, alias = self._table_columns(table)
            if len(values) > len(names):
                raise SourceMisconfigured(
                    f"turso source {self.id!r}: a row of {table!r} (change after {self._decode_at}) holds "
                    f"{len(values)} values and the table has {len(names)} columns ({', '.join(names)}): its "
                    "columns changed in a way turso_cdc does not record (a table renamed to this name); "
                    "re-snapshot the table from a position after it"
                )
        row = dict(zip(names, values, strict=False))
        for name in names[len(values) :]:
            row[name] = None  # a column added after this row was written
        if alias is not None and row.get(names[alias]) is None:
            row[names[alias]] = rowid
        return row

    def _schema_then(self, table: str) -> str | None:
        """The CREATE TABLE in force for rows at the read position, when DDL later in
        ``turso_cdc`` changed it (its first such change's before image); None: the current one.

        A reader that is behind must decode old rows with the columns they were written with:
        after a DROP COLUMN the current columns would shift their values into the wrong names.
        """
        later = self._conn.execute(
            "SELECT before FROM turso_cdc WHERE change_id > ? AND table_name = 'sqlite_schema' "
            "AND before IS NOT NULL ORDER BY change_id",
            (self._decode_at,),
        ).fetchall()
        for (before,) in later:
            rec = decode_record(before)
            if len(rec) >= 5 and rec[0] == "table" and rec[2] == table and isinstance(rec[4], str):
                return rec[4]
        return None

    def _table_columns(self, table: str) -> tuple[list[str], int | None]:
        cached = self._columns.get(table)
        if cached is None:
            then = self._schema_then(table)
            if then is not None:
                info = table_info(then, table)
            else:
                info = self._conn.execute(f"PRAGMA table_info({quote_name(table)})").fetchall()
            names = [r[1] for r in info]
            # Each table's columns as first decoded after an opening or a DDL: the reader keeps
            # a new version of them (and says what a column added or retyped may have changed).
            columns = [{"name": str(r[1]), "type": str(r[2]), "key": bool(r[5])} for r in info]
            self._schema_changes.append((table, columns, TursoPosition(self._decode_at, resets=self.resets)))
            pks = [r for r in info if r[5]]
            alias = None
            if len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER":
                alias = int(pks[0][0])
            self._keys[table] = tuple(r[1] for r in sorted(pks, key=lambda r: r[5]))  # pk order
            cached = (names, alias)
            self._columns[table] = cached
        return cached
