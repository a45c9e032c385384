"""PostgreSQL source: logical decoding with pgoutput through SQL, using asyncpg.

asyncpg cannot speak START_REPLICATION, so changes are read with
``pg_logical_slot_peek_binary_changes`` and the slot is moved with
``pg_replication_slot_advance`` — and only ever to a position every sink has
durably checkpointed (``confirm``), so WAL is released and nothing
unacknowledged is lost.

Positions: transactions arrive in commit order, so an event's order is
``(commit LSN of its transaction, index in the transaction)``. A checkpoint
also names ``lsn``: the end LSN of the last *complete* transaction, which is
where the slot may safely be advanced to.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg

from deltaforge.events import Event, SourceInfo
from deltaforge.sources.base import PositionLost, Source, SourceError
from deltaforge.sources.mysql_checks import SourceMisconfigured
from deltaforge.sources.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Change,
    Commit,
    DecodeError,
    Relation,
    Truncate,
    decode,
    format_lsn,
)
from deltaforge.sources.pgtypes import converter

END = 1 << 31  # the "seq" of a transaction's end: after every event in it
PG_EPOCH_MS = 946_684_800_000  # 2000-01-01 in Unix milliseconds


class PostgresSource(Source):
    """Row changes from a logical replication slot (pgoutput)."""

    connector = "postgres"

    def __init__(self, config: dict[str, Any], tenant: str = "default") -> None:
        self.id: str = config["id"]
        self.dsn = str(config["dsn"])
        self.slot = str(config.get("slot", "deltaforge"))
        self.publication = str(config.get("publication", "deltaforge"))
        self.tables = [str(t) for t in config.get("tables", [])]
        self.create = bool(config.get("create", True))
        self.chunk = int(config.get("read_chunk", 5000))
        self.heartbeat_s = int(config.get("heartbeat_ms", 10_000)) / 1000
        self._idle = int(config.get("poll_interval_ms", 100)) / 1000
        self.tenant = tenant
        self._conn: asyncpg.Connection | None = None
        self.db = ""
        self._relations: dict[int, tuple[Relation, list[Any]]] = {}
        self._last_commit = 0  # commit LSN of the last transaction handed out
        self._confirmed = 0  # the slot's confirmed_flush_lsn as we last set or saw it
        self._unconfirmed: list[tuple[int, int]] = []  # (end_lsn, messages) read but not confirmed
        self._last_heartbeat = 0.0
        self._tx_prefix = ""

    @staticmethod
    def order_of(checkpoint: dict[str, Any]) -> tuple[int, ...]:
        return (int(checkpoint.get("commit_lsn", 0)), int(checkpoint.get("seq", END)))

    @property
    def idle_wait(self) -> float:
        return self._idle

    async def open(self, resume_after: dict[str, Any] | None) -> None:
        try:
            conn = await asyncpg.connect(self.dsn, timeout=10)
        except (OSError, asyncpg.PostgresError) as exc:
            raise SourceError(f"postgres source {self.id!r}: cannot connect: {exc}") from None
        self._conn = conn
        self.db = str(await conn.fetchval("SELECT current_database()"))
        level = await conn.fetchval("SHOW wal_level")
        if level != "logical":
            raise SourceMisconfigured(
                f"postgres source {self.id!r}: wal_level is {level}; set wal_level=logical"
            )
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
            if resume_after is not None:
                raise PositionLost(f"replication slot {self.slot!r} does not exist (dropped?)")
            if not self.create:
                raise SourceMisconfigured(
                    f"replication slot {self.slot!r} does not exist and create is false"
                )
            await self._create()
            slot = await conn.fetchrow(
                "SELECT confirmed_flush_lsn, plugin, database FROM pg_replication_slots WHERE slot_name = $1",
                self.slot,
            )
        elif slot["plugin"] != "pgoutput":
            raise SourceMisconfigured(f"replication slot {self.slot!r} uses {slot['plugin']}, not pgoutput")
        self._confirmed = int(slot["confirmed_flush_lsn"] or 0)
        if resume_after is not None:
            safe = int(resume_after["lsn"])
            if self._confirmed > safe:
                raise PositionLost(
                    f"slot {self.slot!r} is at {format_lsn(self._confirmed)}, past the checkpoint "
                    f"{format_lsn(safe)}; the changes in between were consumed elsewhere"
                )
            await self._advance(safe)
            self._last_commit = int(resume_after.get("commit_lsn", 0))
        self._relations = {}
        self._unconfirmed = []
        self._last_heartbeat = time.monotonic()

    async def _create(self) -> None:
        assert self._conn is not None
        exists = await self._conn.fetchval(
            "SELECT 1 FROM pg_publication WHERE pubname = $1", self.publication
        )
        if not exists:
            target = (
                "FOR TABLE " + ", ".join(_quote_table(t) for t in self.tables)
                if self.tables
                else "FOR ALL TABLES"
            )
            await self._conn.execute(f'CREATE PUBLICATION "{self.publication}" {target}')
        await self._conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", self.slot)

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close(timeout=5)

    async def confirm(self, checkpoint: dict[str, Any]) -> None:
        """Every sink has this checkpoint durably: the slot may release WAL up to it."""
        await self._advance(int(checkpoint["lsn"]))

    async def _advance(self, lsn: int) -> None:
        if lsn <= self._confirmed or self._conn is None:
            return
        await self._conn.execute("SELECT pg_replication_slot_advance($1, $2)", self.slot, lsn)
        self._confirmed = lsn
        self._unconfirmed = [t for t in self._unconfirmed if t[0] > lsn]

    async def read(self) -> list[Event]:
        conn = self._conn
        if conn is None:
            raise SourceError(f"postgres source {self.id!r} is not open")
        skip = sum(n for _, n in self._unconfirmed)
        try:
            wal_now = int(await conn.fetchval("SELECT pg_current_wal_lsn()"))
            rows = await conn.fetch(
                "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2, "
                "'proto_version', '1', 'publication_names', $3)",
                self.slot,
                skip + self.chunk,
                self.publication,
            )
        except asyncpg.UndefinedObjectError as exc:
            raise PositionLost(f"replication slot {self.slot!r} is gone ({exc})") from None
        except (OSError, asyncpg.PostgresError) as exc:
            raise SourceError(f"postgres source {self.id!r}: {type(exc).__name__}: {exc}") from None
        events = self._decode(rows)
        idle = not events and not self._unconfirmed and wal_now > self._confirmed
        if idle and time.monotonic() - self._last_heartbeat >= self.heartbeat_s:
            self._last_heartbeat = time.monotonic()
            return [self._heartbeat(wal_now)]
        return events

    def _heartbeat(self, lsn: int) -> Event:
        """No change of ours committed before ``lsn``: let checkpoints (and so the slot) move there."""
        cp = {"lsn": lsn, "commit_lsn": lsn - 1, "seq": END}
        self._unconfirmed.append((lsn, 0))
        return Event(
            op="h",
            before=None,
            after=None,
            source=SourceInfo(self.connector, self.db, "", cp, int(time.time() * 1000)),
            tx_id="heartbeat",
            tx_end=True,
            event_id=f"heartbeat:{lsn}",
            order=(lsn - 1, END),
            checkpoint=cp,
            tenant=self.tenant,
            size=64,
        )

    def _decode(self, rows: list[Any]) -> list[Event]:
        out: list[Event] = []
        tx: list[Event] = []
        skipping = False
        begin: Begin | None = None
        count = 0
        safe = self._confirmed if not self._unconfirmed else self._unconfirmed[-1][0]
        for lsn, data in rows:
            if skipping and data[:1] not in (b"C", b"R"):
                count += 1
                continue
            msg = decode(data, int(lsn))
            count += 1
            if isinstance(msg, Begin):
                begin, tx, count = msg, [], 1
                self._tx_prefix = format_lsn(msg.final_lsn)
                skipping = msg.final_lsn <= self._last_commit
            elif isinstance(msg, Relation):
                # str is the identity on text values: None marks "keep as is"
                convs = [None if (f := converter(c.type_oid)) is str else f for c in msg.columns]
                self._relations[msg.relid] = (msg, convs)
            elif isinstance(msg, Commit):
                if not skipping and begin is not None:
                    if tx:
                        cp = {"lsn": msg.end_lsn, "commit_lsn": msg.commit_lsn, "seq": END}
                        last = tx[-1]
                        tx[-1] = Event(
                            last.op, last.before, last.after, last.source, last.tx_id, True, last.event_id,
                            last.order, cp, last.tenant, last.size,
                        )  # fmt: skip
                        out.extend(tx)
                    self._last_commit = msg.commit_lsn
                    self._unconfirmed.append((msg.end_lsn, count))
                    safe = msg.end_lsn
                skipping, begin, tx = False, None, []
            elif skipping or begin is None:
                continue
            elif isinstance(msg, Change):
                tx.append(self._change(msg, begin, len(tx), safe, int(lsn)))
            elif isinstance(msg, Truncate):
                for relid in msg.relids:
                    rel = self._relation(relid, int(lsn))
                    tx.append(self._event("t", None, None, rel, begin, len(tx), safe))
        return out

    def _relation(self, relid: int, lsn: int) -> Relation:
        hit = self._relations.get(relid)
        if hit is None:
            raise DecodeError(lsn, f"change for relation {relid} before its Relation message")
        return hit[0]

    def _change(self, msg: Change, begin: Begin, seq: int, safe: int, lsn: int) -> Event:
        hit = self._relations.get(msg.relid)
        if hit is None:
            raise DecodeError(lsn, f"change for relation {msg.relid} before its Relation message")
        rel, convs = hit
        names = [c.name for c in rel.columns]
        before = _row(names, convs, msg.old) if msg.old is not None else None
        after = _row(names, convs, msg.new) if msg.new is not None else None
        return self._event(msg.op, before, after, rel, begin, seq, safe)

    def _event(
        self,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        rel: Relation,
        begin: Begin,
        seq: int,
        safe: int,
    ) -> Event:
        cp = {"lsn": safe, "commit_lsn": begin.final_lsn, "seq": seq}
        return Event(
            op,
            before,
            after,
            SourceInfo(
                self.connector, self.db, rel.name, cp, PG_EPOCH_MS + begin.commit_ts // 1000, rel.namespace
            ),
            str(begin.xid),
            False,
            f"{self._tx_prefix}:{seq}",
            (begin.final_lsn, seq),
            cp,
            self.tenant,
            128 + 32 * len(after or before or ()),
        )


def _row(names: list[str], convs: list[Any], values: list[Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name, conv, value in zip(names, convs, values, strict=False):
        if value is None or (conv is None and value is not UNCHANGED_TOAST):
            row[name] = value
        elif value is UNCHANGED_TOAST:
            row[name] = {"__unchanged_toast__": True}
        else:
            row[name] = conv(value) if isinstance(value, str) else value
    return row


def _quote_table(name: str) -> str:
    schema, _, table = name.rpartition(".")
    return f'"{schema or "public"}"."{table}"'
