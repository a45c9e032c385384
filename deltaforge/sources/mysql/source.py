"""MySQL/MariaDB source: row events from the binlog via python-mysql-replication.

The binlog is decoded in a child process (``decoder.py``, see
``childproc.py``) so that the library's pure-Python decoding runs beside the
event loop instead of sharing its GIL; here whole transactions become events.

Positions: MariaDB resumes by GTID (``auto_position``), MySQL by file/pos.
Every event's order is ``(binlog file number, end position of its row event,
row index)``; the last event of a transaction is checkpointed at its XID event,
so a resume starts exactly after the committed transaction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from actors import BlockingRunner
from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event
from deltaforge.plugins import decoder_module
from deltaforge.position import Position, PositionDoc
from deltaforge.snapshot.chunks import ChunkReader
from deltaforge.sources.base import (
    DeclaredTable,
    PositionLost,
    SchemaChange,
    Source,
    SourceError,
    SourceMisconfigured,
    SourceUnavailable,
    own_position,
)
from deltaforge.sources.childproc import ChildDecoder
from deltaforge.sources.made import ChildRecords
from deltaforge.sources.mysql import failover
from deltaforge.sources.mysql.binlog import DecoderSettings
from deltaforge.sources.mysql.checks import (
    MySQLSettings,
    ServerInfo,
    check_preconditions,
    default_server_id,
    is_unavailable,
)
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.names import matches
from deltaforge.sources.mysql.position import BinlogPosition
from deltaforge.sources.mysql.positions import check_position, current_position, earliest_position
from deltaforge.sources.mysql.retention import BinlogRetention
from deltaforge.sources.mysql.txevents import TxEvents
from deltaforge.sources.saidonce import SaidOnce

T = TypeVar("T")
log = structlog.get_logger()


class MySQLSource(Source):
    """Row changes from a MySQL 8 or MariaDB binlog."""

    connector = "mysql"

    def __init__(self, config: MySQLSourceConfig, tenant: str = "default") -> None:
        self.id = config.id
        self.settings = dataclasses.replace(
            MySQLSettings.from_dsn(config.dsn), query_timeout_s=config.query_timeout_s
        )
        self.by_file = config.resume_by == "file"
        self.on_schema_drift = config.on_schema_drift
        self.cascades = config.foreign_key_cascades
        self.captured = [tuple(t.split(".", 1)) for t in config.tables]
        db = self.settings.database
        self.signal_table = config.snapshot.signal_table or (f"{db}.deltaforge_signal" if db else None)
        # Watermarks are rows of the signal table: it is read like a captured table, never delivered.
        signal = [tuple(self.signal_table.split(".", 1))] if self.signal_table and self.captured else []
        self.patterns = [*self.captured, *signal]
        self.chosen_server_id = config.server_id
        self.chunk = config.read_chunk
        self.tenant = tenant
        self.info: ServerInfo | None = None
        self._decoder: ChildDecoder | None = None
        self._gen = 0  # failovers and resets before this opening: leads its positions
        self._txs = TxEvents(self.connector, tenant, 0, "", {})
        self._records = ChildRecords(self.id)  # what the decoder child makes (sources/made.py)
        self._schema_changes: list[SchemaChange] = []
        self._lock = threading.Lock()
        self._threads = BlockingRunner(1)
        self.retention = BinlogRetention(self.id, self.by_file)
        self._checks = BlockingRunner(1)  # beside the reading, which holds the other thread
        self._look: asyncio.Future[None] | None = None
        self._look_failures = SaidOnce()

    @property
    def server_id(self) -> int:
        """The replica server id the binlog is read with: ``server_id`` as set, or one derived from
        the source's id and :attr:`scope`; two pipelines' sources of one id (each in its own
        store, on its own machine) get two ids."""
        return self.chosen_server_id or default_server_id(
            f"{self.scope}|{self.id}" if self.scope else self.id
        )

    def captures(self, db: str, table: str) -> bool:
        """Whether ``db.table`` is one of the tables this source delivers changes of (in any case
        on a server that folds names, as the decoder matches them)."""
        return matches(self.captured, db, table, self.info is not None and self.info.names_fold_case)

    def chunk_reader(self, settings: SnapshotSettings) -> ChunkReader | None:
        from deltaforge.sources.mysql.snapshot import MySQLChunks

        if self.signal_table is None:
            if settings.mode == "never":
                return None  # snapshots cannot be asked for; nothing else needs them
            raise SourceMisconfigured(
                f"mysql source {self.id!r}: snapshot.signal_table: required when the DSN names no database "
                "(expected db.table, where watermarks are written)"
            )
        if "." not in self.signal_table:
            raise SourceMisconfigured(
                f"mysql source {self.id!r}: snapshot.signal_table: expected db.table, got {self.signal_table!r}"
            )
        return MySQLChunks(self, self.signal_table)

    @staticmethod
    def load_position(doc: PositionDoc) -> BinlogPosition:
        return BinlogPosition.from_doc(doc)

    @property
    def idle_wait(self) -> float:
        return 0.0  # read() itself waits on the queue

    # -- lifecycle ---------------------------------------------------------------
    async def open(self, resume_after: Position | None) -> None:
        resume = own_position(resume_after, BinlogPosition)
        started = own_position(self.start_from, BinlogPosition)
        # Binlog coordinates start again after a failover and after a reset alike: both lead the
        # order (``Source.resets``), and both only grow, so their sum does too.
        gen = self.generation + self.resets
        if resume is None and self.from_now and started is not None and started.gen == gen:
            resume = started  # checked like a checkpoint: purged since, the position is lost
        self._gen = gen
        if resume is not None and resume.gen != self._gen:
            resume = self._on_another_server(resume)
        self.retention.opened(gen)
        decoder = ChildDecoder(
            f"mysql source {self.id!r}", decoder_module(self.connector), self._handle, self.settings.stall_s
        )
        decoder.spawn()  # it starts up while the server is checked
        try:
            info, start = await self._ask(lambda conn: self._check(conn, resume))
        except BaseException:
            await self._threads.run(decoder.stop)
            raise
        self.info = info
        if resume is None:
            # No checkpoint: the earliest change still on the server, or, when a snapshot is about to
            # copy the tables, the newest (``start`` is then the current position).
            resume = start._replace(gen=self._gen)
            if self.from_now:
                self.start_from = resume
        self._txs = TxEvents(self.connector, self.tenant, self._gen, resume.gtid, self._txs.keys)
        cfg: DecoderSettings = {
            "connection": self.settings.replication(),
            "server_id": self.server_id,
            "is_mariadb": info.is_mariadb,
            "by_file": self.by_file,
            "resume": resume.to_doc(),
            "patterns": self.patterns,
            "schemas": sorted({p[0] for p in self.patterns if not any(ch in p[0] for ch in "*?[")}),
            "chunk": self.chunk,
            "fold_case": info.names_fold_case,
            "envelopes": {"connector": self.connector, "tenant": self.tenant, "gen": self._gen}
            if self.native_envelopes and self._records.ok
            else None,
        }
        decoder.start(cfg)
        self._decoder = decoder

    def _on_another_server(self, checkpoint: BinlogPosition) -> BinlogPosition:
        """The checkpoint was read from the server before a failover (the reconciler found it
        reachable here): resume by its GTID position alone, in the new generation."""
        if checkpoint.gen > self._gen:
            raise SourceMisconfigured(
                f"the checkpoint is from failover generation {checkpoint.gen}, but the state store "
                f"knows only {self._gen} (was the identity record removed?)"
            )
        if self.by_file or not checkpoint.gtid:
            raise SourceMisconfigured(
                "failover detected: the checkpoint has no GTID position to resume from on another server "
                f"(resume_by: {'file' if self.by_file else 'auto'}). Re-snapshot from the new server."
            )
        log.info("position_adjusted", source=self.id, gtid=checkpoint.gtid, generation=self._gen,
                 checkpoint=checkpoint.to_doc())  # fmt: skip
        return BinlogPosition("", 0, 0, checkpoint.gtid, 0, self._gen)

    async def identity(self) -> dict[str, str] | None:
        return await self._ask(failover.identity)

    async def reconcile(self, checkpoint: Position, previous: dict[str, str] | None) -> None:
        cp = own_position(checkpoint, BinlogPosition)
        assert cp is not None
        if previous is not None and self.by_file:
            raise SourceMisconfigured(
                "failover detected: the DSN now leads to another server, and resume_by: file cannot "
                "resume there (binlog coordinates differ between servers). Re-snapshot from the new server."
            )
        await self._ask(lambda conn: failover.check_reachable(conn, cp, previous))

    async def filled(self, table: str, columns: list[str]) -> list[str]:
        db, name = table.split(".", 1)

        def ask(conn: Any) -> set[str]:
            with conn.cursor() as cur:
                # MariaDB shows a NULL default as the text 'NULL'; NOT NULL without one fills 0 or ''
                cur.execute(
                    "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
                    "TABLE_NAME = %s AND (IS_NULLABLE = 'NO' OR EXTRA LIKE '%%GENERATED%%' OR "
                    "(COLUMN_DEFAULT IS NOT NULL AND UPPER(COLUMN_DEFAULT) <> 'NULL'))",
                    (db, name),
                )
                return {str(r[0]) for r in cur.fetchall()}

        have = await self._ask(ask)
        return [c for c in columns if c in have]

    async def _ask(self, work: Callable[[Any], T]) -> T:
        """``work``'s answer on a short connection. A stop does not wait for it: a server alive
        but answering nothing (stopped, its host frozen) leaves the question waiting
        ``query_timeout_s``, and the stop waited with it, then the process's exit."""
        return await self._threads.run(self._with_connection, work, abandon_on_cancel=True)

    def _with_connection(self, work: Callable[[Any], T]) -> T:
        """``work`` on a short connection (blocking: in a worker thread); a server that is down is
        unavailable, not an error."""
        conn = self.settings.connect()
        try:
            return work(conn)
        except Exception as exc:
            if is_unavailable(exc):
                raise SourceUnavailable(f"mysql {self.settings.where}: {type(exc).__name__}: {exc}") from None
            raise
        finally:
            conn.close()

    async def describe_tables(self) -> list[DeclaredTable]:
        return await self._ask(self._describe_sync)

    def _describe_sync(self, conn: Any) -> list[DeclaredTable]:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA NOT IN ('mysql', 'sys', 'information_schema', 'performance_schema') "
                "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION"
            )
            rows = cur.fetchall()
        tables: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for schema, table, column, typ in rows:
            if self.captures(schema, table):
                tables.setdefault((schema, table), []).append((column, str(typ)))
        return [DeclaredTable(db, t, tuple(cols)) for (db, t), cols in tables.items()]

    def _check(self, conn: Any, resume_after: BinlogPosition | None) -> tuple[ServerInfo, BinlogPosition]:
        info = check_preconditions(conn, self.settings.where, self.captured, self.cascades)
        if resume_after:
            check_position(conn, resume_after, info, by_gtid=info.is_mariadb and not self.by_file)
        if resume_after is None and self.from_now:
            return info, current_position(conn, info)
        return info, earliest_position(conn, info)

    @property
    def retained_bytes(self) -> int | None:
        return self.retention.retained

    async def confirm(self, checkpoint: Position) -> None:
        held = own_position(checkpoint, BinlogPosition)
        # (a position read from the server before a failover names files of another server)
        if held is not None and held.gen == self._gen:
            self.retention.confirmed(held)

    def _watch_binlog(self) -> None:
        """Start a look at the binlog files when one is due (see ``retention.py``), in a task of
        its own: a server that does not answer must not hold up reading, whose own checks notice."""
        check = self._look
        if check is not None and check.done():
            self._look = None
            failed = None if check.cancelled() else check.exception()
            if failed is not None and not isinstance(failed, SourceUnavailable):
                if (error := self._look_failures.new(failed)) is not None:
                    log.warning("binlog_check_failed", source=self.id, error=error,
                                reason=f"the binlog retention check did not run; tried again in {self.retention.every_s:g} s")  # fmt: skip
            elif failed is None and not check.cancelled():
                self._look_failures.through()
        if self._look is None and self.retention.due():
            self._look = asyncio.ensure_future(
                self._checks.run(self._with_connection, self.retention.check, abandon_on_cancel=True)
            )

    async def close(self) -> None:
        check, self._look = self._look, None
        if check is not None:
            check.cancel()
            await asyncio.gather(check, return_exceptions=True)
        decoder, self._decoder = self._decoder, None
        if decoder is not None:
            await self._threads.run(decoder.stop)

    def caught_up(self) -> bool:
        return self._decoder is None or self._decoder.caught_up()

    async def read(self) -> list[Event]:
        if self._decoder is None:
            raise SourceError(f"mysql source {self.id!r} is not open")
        self._watch_binlog()
        if self.retention.reset is not None:
            raise PositionLost(self.retention.reset)
        item = await self._threads.run(self._decoder.next_chunk, self.chunk)
        if isinstance(item, BaseException):
            raise item
        if item:
            first, last = item[0].checkpoint, item[-1].checkpoint
            assert isinstance(first, BinlogPosition) and isinstance(last, BinlogPosition)
            self.retention.read(first, last)
        return item

    def take_schema_changes(self) -> list[SchemaChange]:
        with self._lock:
            changes, self._schema_changes = self._schema_changes, []
        return changes

    # -- the decoder's frames (in its pump thread) ----------------------------------
    def _handle(self, frame: tuple[Any, ...]) -> list[Event] | None:
        kind = frame[0]
        if kind == "txs":
            return self._records.events(frame, self._txs)
        if kind == "moved":
            log.warning(
                "captured_table_renamed" if frame[2] else "captured_table_dropped", source=self.id,
                table=frame[1], to=frame[2], at=frame[3],
                reason="its changes are no longer captured under a name in tables; the rows already "
                "delivered stay in the sinks" + (f" (add {frame[2]} to tables to go on capturing it)" if frame[2] else ""),
            )  # fmt: skip
            return None
        if kind == "moved_in":
            log.warning(
                "captured_table_renamed_in", source=self.id, table=frame[1], renamed_from=frame[2], at=frame[3],
                reason=f"its rows came under a captured name without a change event for any of them: unless they are "
                f"the rows of the table it replaced (an online schema change's cut-over: gh-ost, pt-online-schema-"
                f"change), the sinks keep that table's rows (snapshot it again: deltaforge snapshot <pipeline> {frame[1]})",
            )  # fmt: skip
            return None
        if kind == "repartitioned":
            log.warning(
                "captured_rows_changed_by_ddl", source=self.id, table=frame[1], statement=frame[2], at=frame[3],
                reason=f"ALTER TABLE ... {frame[2]} changes rows without a row event for any of them: the sinks "
                f"keep those rows as they were (snapshot the table again: deltaforge snapshot <pipeline> {frame[1]})",
            )  # fmt: skip
            return None
        if kind == "partial":
            log.warning(
                "partial_row_image", source=self.id, table=frame[1], at=frame[2], columns=frame[3],
                reason="a session wrote with binlog_row_image MINIMAL or NOBLOB: the values its rows leave out "
                'arrive as {"__not_logged__": true}, not as NULL; set binlog_row_image=FULL for every session',
            )  # fmt: skip
            return None
        if kind == "schema":
            self._txs.keys[frame[1]] = tuple(frame[4])  # in the key's order, as snapshots have it
            with self._lock:
                at = BinlogPosition.from_doc(frame[3])._replace(gen=self._gen)
                self._schema_changes.append((frame[1], frame[2], at))
            return None
        if frame[1] == "position_lost":
            raise PositionLost(f"the server cannot serve the binlog from the checkpoint ({frame[2]})")
        if frame[1] == "misconfigured":
            raise SourceMisconfigured(f"mysql source {self.id!r} ({self.settings.where}): {frame[2]}")
        if frame[1] == "unavailable":
            raise SourceUnavailable(f"mysql source {self.id!r} ({self.settings.where}): {frame[2]}")
        raise SourceError(f"mysql source {self.id!r} ({self.settings.where}): {frame[2]}")
