"""PostgreSQL source: logical decoding with pgoutput over streaming replication.

A child process (``decoder.py``, see ``childproc.py``) streams the slot with
``START_REPLICATION`` and decodes pgoutput, so each change is read once, however
far a sink lags. The slot moves only to a position every sink has durably
checkpointed (``confirm`` hands it to the child, which reports it as flushed),
so WAL is released and nothing unacknowledged is lost. This side uses asyncpg
for the checks at open and to move an idle slot to the resume point.

Positions: transactions arrive in commit order, so an event's order is
``(commit LSN of its transaction, index in the transaction)``. A checkpoint
also names ``lsn``: the end LSN of the last *complete* transaction, which is
where the slot may safely be advanced to.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from actors import BlockingRunner
from deltaforge.configmodel import SnapshotSettings
from deltaforge.events import Event
from deltaforge.plugins import decoder_module
from deltaforge.position import Position, PositionDoc
from deltaforge.snapshot.chunks import ChunkReader
from deltaforge.sources.base import (
    ColumnsRewritten,
    DeclaredTable,
    PositionLost,
    SchemaChange,
    Source,
    SourceError,
    SourceMisconfigured,
    SourceUnavailable,
    own_position,
    unanswered,
)
from deltaforge.sources.childproc import ChildDecoder
from deltaforge.sources.made import ChildRecords
from deltaforge.sources.postgres import connections, failover
from deltaforge.sources.postgres import slot as slot_ops
from deltaforge.sources.postgres.config import PostgresSourceConfig
from deltaforge.sources.postgres.errors import DecodeFailed, describe, is_unavailable
from deltaforge.sources.postgres.frames import Transactions
from deltaforge.sources.postgres.holder import Walsender
from deltaforge.sources.postgres.names import quote_table, split
from deltaforge.sources.postgres.pgoutput import format_lsn
from deltaforge.sources.postgres.position import END, PgPosition
from deltaforge.sources.postgres.publication_watch import PublicationWatch
from deltaforge.sources.postgres.retention import SlotRetention
from deltaforge.sources.postgres.watched import BACKEND, Watched

if TYPE_CHECKING:  # the decoder module imports psycopg, which only its child process needs (70 ms)
    from deltaforge.sources.postgres.decoder import DecoderSettings

log = structlog.get_logger()


class PostgresSource(Source):
    """Row changes from a logical replication slot (pgoutput)."""

    connector = "postgres"

    def __init__(self, config: PostgresSourceConfig, tenant: str = "default") -> None:
        self.id = config.id
        self.who = f"postgres source {config.id!r}"
        """How errors and logs name it."""
        self.dsn = config.dsn
        self.slot = config.slot
        self.publication = config.publication
        self.tables = list(config.tables)
        self.create = config.create
        self.signal_table = config.snapshot.signal_table
        self.on_schema_drift = config.on_schema_drift
        self._schema_changes: list[SchemaChange] = []
        self._lock = threading.Lock()  # the schema changes come from the decoder's pump thread
        self.chunk = config.read_chunk
        self.heartbeat_s = config.heartbeat_ms / 1000
        self._idle = config.poll_interval_ms / 1000
        self._silence = config.receiver_timeout_ms / 1000
        self._silence_bound = config.silence_bound_s
        self.query_timeout = config.query_timeout_s
        self.long = Watched(self._connection, self.query_timeout, self.who, self.id)
        """The control connection's long questions, watched from another (watched.py)."""
        self._walsender: Walsender | None = None  # of the last stream started: see holder.py
        self.given_up: dict[tuple[int, str], int] = {}
        """Backends of snapshot reads given up for not answering, with how often each was ended
        since (snapshot.py): kept here, past the snapshot reader's own restarts."""
        self.tenant = tenant
        self._conn: asyncpg.Connection | None = None
        self.retention = SlotRetention(self.id, self.slot, config.wal_warn_mb << 20)
        self.watch = PublicationWatch(self.publication, self._listed(), self.retention)
        self.txs = Transactions(self.connector, tenant)
        self._seen: tuple[int, int, int] | None = None  # see DecoderSettings.seen
        self._confirmed = 0  # the slot's confirmed_flush_lsn as we last set or saw it
        self._decoder: ChildDecoder | None = None
        self._threads = BlockingRunner(1)
        self._failover = False  # set by reconcile(): the next open must not advance the slot
        self._records = ChildRecords(self.id)  # what the decoder child makes (sources/made.py)

    @property
    def db(self) -> str:
        """The database the slot reads ("" until the first opening): the events' ``source.db``."""
        return self.txs.db

    def chunk_reader(self, settings: SnapshotSettings) -> ChunkReader:
        from deltaforge.sources.postgres.snapshot import PostgresChunks

        return PostgresChunks(self, settings)

    @staticmethod
    def load_position(doc: PositionDoc) -> PgPosition:
        return PgPosition.from_doc(doc)

    @property
    def idle_wait(self) -> float:
        return self._idle

    @property
    def retained_bytes(self) -> int | None:
        return self.retention.retained

    async def open(self, resume_after: Position | None) -> None:
        try:
            await self._open(own_position(resume_after, PgPosition))
        except TimeoutError:  # a question on the control connection unanswered: see connections.py
            raise unanswered(self.who, self.query_timeout) from None
        except Exception as exc:
            if is_unavailable(exc):
                raise SourceUnavailable(f"{self.who}: {describe(exc, self.dsn)}") from None
            raise
        finally:
            self._failover = False

    async def identity(self) -> dict[str, str] | None:
        async with self._connection() as conn:
            return await failover.identity(conn)

    async def reconcile(self, checkpoint: Position, previous: dict[str, str] | None) -> None:
        if previous is None:
            return  # the same server: open() checks the slot against the checkpoint
        cp = own_position(checkpoint, PgPosition)
        assert cp is not None
        # Whatever the checks conclude short of position lost (even "cannot tell"), this is a new
        # primary: open() must not move its slot to the old primary's checkpoint.
        self._failover = True
        async with self._connection() as conn:
            await failover.check_reachable(conn, self.slot, self.publication, cp.lsn, previous)

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return connections.short(self.dsn, self.query_timeout, self.who)

    async def forget(self) -> None:
        """Drop the slot (``slot.forget``): it keeps WAL for ever, and nothing reads it again."""
        await slot_ops.forget(self._connection, self.slot, self.id)

    async def _open(self, resume: PgPosition | None) -> None:
        self.resets = max(self.resets, resume.resets if resume else 0)  # a store that lost the count
        self.txs.resets = self.resets
        decoder = ChildDecoder(
            self.who,
            decoder_module(self.connector),
            self._handle,
            self._silence_bound,
        )
        decoder.spawn()  # it starts up while the slot is checked
        try:
            await self._prepare(resume)
        except BaseException:
            await self._threads.run(decoder.stop)
            raise
        cfg: DecoderSettings = {
            "dsn": self.dsn,
            "slot": self.slot,
            "publication": self.publication,
            "chunk": self.chunk,
            "heartbeat_s": self.heartbeat_s,
            "idle_s": self._idle,
            "silence_s": self._silence,
            "catalog_idle_s": self._silence_bound,
            "last_commit": self.txs.last_commit,
            "envelopes": self.txs.opening() if self.native_envelopes and self._records.ok else None,
            "seen": self._seen,
        }
        decoder.start(cfg)
        self._decoder = decoder

    async def _prepare(self, resume: PgPosition | None) -> None:
        """Check the server and the slot (create it if asked), and move it to ``resume``."""
        try:
            conn = await connections.connect(self.dsn, self.query_timeout, self.who)
        except asyncpg.PostgresError as exc:
            if is_unavailable(exc):
                raise
            raise SourceError(f"{self.who}: cannot connect: {exc}") from None
        self._conn = conn
        await slot_ops.end_stale(conn, self.slot, self._walsender, self.who)
        await self.long.end_given_up(conn, self.slot)
        db, pid, started = await conn.fetchrow(BACKEND)
        self.txs.db, self.long.backend = str(db), (pid, started)  # the latter for the watch
        level = await conn.fetchval("SHOW wal_level")
        if level != "logical":
            raise SourceMisconfigured(f"{self.who}: wal_level is {level}; set wal_level=logical")
        await slot_ops.name_durability_risks(conn, self.id)
        slot = await conn.fetchrow(
            "SELECT confirmed_flush_lsn, plugin, database FROM pg_replication_slots WHERE slot_name = $1",
            self.slot,
        )
        if slot is not None and slot["database"] != self.db:
            raise SourceMisconfigured(
                f"replication slot {self.slot!r} belongs to database {slot['database']!r}, not {self.db!r}; "
                "slot names are cluster-wide: give this source its own slot"
            )
        if slot is None:
            if resume is not None:
                raise PositionLost(f"replication slot {self.slot!r} does not exist (dropped?)")
            if not self.create:
                raise SourceMisconfigured(
                    f"replication slot {self.slot!r} does not exist and create is false"
                )
            await slot_ops.create(conn, self.slot, self.publication, self._listed(), self.long)
            slot = await conn.fetchrow(
                "SELECT confirmed_flush_lsn, plugin, database FROM pg_replication_slots WHERE slot_name = $1",
                self.slot,
            )
        elif slot["plugin"] != "pgoutput":
            raise SourceMisconfigured(f"replication slot {self.slot!r} uses {slot['plugin']}, not pgoutput")
        # Not after a failover: another server's catalog rows may differ from the ones noted.
        resuming = resume is not None and not self._failover
        await self.watch.opened(conn, self.remembered, resuming, self.create, self.who)
        self._confirmed = int(slot["confirmed_flush_lsn"] or 0)
        # No checkpoint: the slot's position is where this opening starts, whatever an earlier
        # opening handed out (a restart dropped it undelivered along with the pipeline's actors).
        self.txs.last_commit = 0
        self.txs.last_time = None
        self._seen = None
        if resume is not None:
            safe = resume.lsn
            if self._failover:
                # A new primary, reconciled: its slot starts where it starts. Advancing it to the old
                # primary's checkpoint would discard this server's commits in between.
                log.info("position_adjusted", source=self.id, slot_at=format_lsn(self._confirmed),
                         checkpoint=format_lsn(safe))  # fmt: skip
            elif self._confirmed > safe:
                raise PositionLost(
                    f"slot {self.slot!r} is at {format_lsn(self._confirmed)}, past the checkpoint "
                    f"{format_lsn(safe)}; the changes in between were consumed elsewhere"
                )
            else:
                await slot_ops.check_within_wal(conn, safe)
                await slot_ops.check_same_commit(conn, self.slot, self.publication, resume, self._confirmed,
                                                 self.long)  # fmt: skip
                await self._advance(safe)
            # A checkpoint inside a transaction (respect_source_tx: false) has delivered only part
            # of it: read that transaction again (sinks skip what they hold, by order).
            self.txs.last_commit = resume.commit_lsn if resume.seq == END else resume.commit_lsn - 1
            if resume.seq == END and not self._failover:  # another server's commits are not this one's
                self.txs.last_time = resume.last_commit
                # A transaction's end or a quiet heartbeat: the last commit before its lsn, where
                # the stream starts (the slot was moved there), so the decoder's heartbeats are quiet.
                if resume.last_commit is not None and (resume.quiet or not resume.last_tx):
                    self._seen = (resume.lsn, *resume.last_commit)

    async def filled(self, table: str, columns: list[str]) -> list[str]:
        async with self._connection() as conn:  # not the control connection: a check may be on it
            found = await conn.fetch(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) "
                "AND attname = ANY($2::text[]) AND (atthasdef OR attnotnull OR attgenerated <> '')",
                quote_table(table), columns,
            )  # fmt: skip
        have = {str(r[0]) for r in found}
        return [c for c in columns if c in have]

    def memo(self) -> dict[str, Any] | None:
        return self.watch.memo()

    async def describe_tables(self) -> list[DeclaredTable]:
        # A short connection: a server that is down is waited for (a Spark transformer starting
        # during an outage asks this), not a crash counted against the pipeline's restarts.
        async with self._connection() as conn:
            rows = await conn.fetch(
                "SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod) "
                "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped "
                "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%' "
                "ORDER BY n.nspname, c.relname, a.attnum"
            )
        wanted = {split(t) for t in self.tables}
        tables: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for schema, table, column, typ in rows:
            if not wanted or (schema, table) in wanted:
                tables.setdefault((schema, table), []).append((column, typ))
        return [DeclaredTable(s, t, tuple(cols)) for (s, t), cols in tables.items()]

    def _listed(self) -> list[str]:
        """The tables the publication must have (none: it publishes all tables). The signal table
        rides along only when tables are listed (all tables include it)."""
        return [*self.tables, *([self.signal_table] if self.signal_table else [])] if self.tables else []

    async def close(self) -> None:
        decoder, self._decoder = self._decoder, None
        if decoder is not None:
            await self._threads.run(decoder.stop)
        # A check still waiting for its answer (a network holding everything) leaves the control
        # connection mid-query: it is dropped, not closed politely, which would wait on it too.
        interrupted = await self.watch.stop()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            if interrupted:
                conn.terminate()
                return
            if decoder is not None and not await slot_ops.released(conn, self.slot):
                conn.terminate()  # silent: its goodbye would not be answered either
                return
            try:
                await conn.close(timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):  # TimeoutError among them
                # A connection that answers nothing (its host vanished; the release's wait above
                # gave up on it mid-query) is dropped: the outage stands, not a failed close.
                conn.terminate()

    async def confirm(self, checkpoint: Position) -> None:
        """Every sink has this checkpoint durably: the slot may release WAL up to it."""
        confirmed = own_position(checkpoint, PgPosition)
        assert confirmed is not None
        if confirmed.lsn > self._confirmed and self._decoder is not None:
            self._decoder.send(("confirm", confirmed.lsn))
            self._confirmed = confirmed.lsn

    async def _advance(self, lsn: int) -> None:
        """Move the slot while no stream holds it (before the decoder starts)."""
        if lsn <= self._confirmed or self._conn is None:
            return
        await slot_ops.advance(self._conn, self.slot, lsn, self.long)
        self._confirmed = lsn

    def take_rewritten(self) -> list[ColumnsRewritten]:
        return self.watch.enums.take()

    def take_schema_changes(self) -> list[SchemaChange]:
        with self._lock:
            changes, self._schema_changes = self._schema_changes, []
        return changes

    async def read(self) -> list[Event]:
        if self._decoder is None:
            raise SourceError(f"{self.who} is not open")
        if self._conn is not None and self._conn.is_closed():
            # The checks run on it (the publication, partitions, the slot's WAL): without it none
            # would run again. Opened again, the opening compares the publication with its memo.
            raise SourceUnavailable(f"{self.who}: its control connection was closed by the server")
        try:
            self.watch.poll(self._conn)
        except TimeoutError:  # a check on the control connection unanswered: reopened, checked anew
            raise unanswered(f"{self.who}: its control connection", self.query_timeout) from None
        item = await self._threads.run(self._decoder.next_chunk, self.chunk)
        if isinstance(item, BaseException):
            raise item
        return item

    def caught_up(self) -> bool:
        return self._decoder is None or self._decoder.caught_up()

    # -- the decoder's frames (in its pump thread) ----------------------------------
    def _handle(self, frame: tuple[Any, ...]) -> list[Event] | None:
        kind = frame[0]
        if kind == "txs":
            return self._records.events(frame, self.txs.events)
        if kind == "schema":
            with self._lock:
                self._schema_changes.append(
                    (frame[1], frame[2], PgPosition.from_doc(frame[3])._replace(resets=self.resets))
                )
            return None
        if kind == "heartbeat":
            return [self.txs.heartbeat(int(frame[1]), frame[2])]
        if kind == "walsender":
            self._walsender = (int(frame[1]), str(frame[2]))
            return None
        if kind == "keyless":
            log.warning(
                "delete_key_not_logged", source=self.id, table=frame[1], key=frame[2], identity=frame[3],
                reason=f"the replica identity of {frame[1]} is an index on {', '.join(frame[3])}, which leaves out "
                f"some of its primary key ({', '.join(frame[2])}): PostgreSQL logs a delete with the index's "
                'columns only, so its key arrives as {"__not_logged__": true} and a Kafka sink cannot key the '
                "delete beside the row's other changes; set REPLICA IDENTITY DEFAULT (the primary key) or FULL",
            )  # fmt: skip
            return None
        if frame[1] == "position_lost":
            raise PositionLost(str(frame[2]))
        if frame[1] == "decode":
            raise DecodeFailed(f"{self.who}: {frame[2]}")
        if frame[1] == "unavailable":
            raise SourceUnavailable(f"{self.who}: {frame[2]}")
        raise SourceError(f"{self.who}: {frame[2]}")
