"""The pgoutput decoder process: peeks the slot, decodes, converts values (see ``childproc.py``).

Frames it writes:

* ``("txs", [(xid, commit_lsn, end_lsn, commit_ts_us, safe_lsn, [(op, schema, table, before, after), ...]), ...])``
  — complete transactions in commit order; ``safe_lsn`` is the end of the last
  complete transaction before this one (where the slot may be advanced to);
* ``("heartbeat", lsn)`` — nothing of ours committed before ``lsn``;
* ``("error", kind, message)`` with kind ``position_lost``, ``decode`` or ``source``, then exit.

The slot is never advanced here: the parent does that once sinks hold a
checkpoint durably. Every peek starts at the slot's confirmed position, so
transactions already sent are recognised by their commit LSN and skipped.
"""

from __future__ import annotations

import asyncio
import time
from typing import IO, Any, TypedDict

from deltaforge.sources.childproc import child_setup, write_frame
from deltaforge.sources.postgres.errors import describe, is_unavailable
from deltaforge.sources.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Change,
    Commit,
    DecodeError,
    Relation,
    Truncate,
    decode,
)
from deltaforge.sources.postgres.values import converter

PEEK = (
    "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2, "
    "'proto_version', '1', 'publication_names', $3)"
)


# pgoutput sends values as their output functions print them, which depends on the decoding
# session's settings: pin the ones values.py parses, whatever the server or database default.
SESSION = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


PRIMARY_KEY = (
    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
    "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = $1 AND i.indisprimary "
    "ORDER BY array_position(i.indkey::int2[], a.attnum)"
)


def row(names: list[str], convs: list[Any], values: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, conv, value in zip(names, convs, values, strict=False):
        if value is None or (conv is None and value is not UNCHANGED_TOAST):
            out[name] = value
        elif value is UNCHANGED_TOAST:
            out[name] = {"__unchanged_toast__": True}
        else:
            out[name] = conv(value) if isinstance(value, str) else value
    return out


class TxDecoder:
    """pgoutput messages to complete transactions, skipping those already handed out."""

    def __init__(self, last_commit: int) -> None:
        self.last_commit = last_commit
        self.relations: dict[int, tuple[Relation, list[str], list[Any]]] = {}
        self.keys: dict[int, list[str]] = {}
        """Each relation's primary-key columns (one list, shared by its changes)."""
        self.unresolved: set[int] = set()
        """Relations whose primary key is still to be read from the catalog."""
        self.pending: list[tuple[int, int]] = []  # (end_lsn, messages) handed out, not yet confirmed

    def confirmed(self, lsn: int) -> int:
        """Forget what the slot has passed; returns how many messages a peek will repeat."""
        self.pending = [p for p in self.pending if p[0] > lsn]
        return sum(n for _, n in self.pending)

    def decode(self, rows: list[Any], confirmed: int) -> list[tuple[Any, ...]]:
        txs: list[tuple[Any, ...]] = []
        safe = self.pending[-1][0] if self.pending else confirmed
        begin: Begin | None = None
        skipping = False
        changes: list[tuple[Any, ...]] = []
        count = 0
        for lsn, data in rows:
            count += 1
            if skipping and data[:1] not in (b"C", b"R"):
                continue
            msg = decode(data, int(lsn))
            if isinstance(msg, Begin):
                begin, changes, count = msg, [], 1
                skipping = msg.final_lsn <= self.last_commit
            elif isinstance(msg, Relation):
                convs = [None if (f := converter(c.type_oid)) is str else f for c in msg.columns]
                known = self.relations.get(msg.relid)
                self.relations[msg.relid] = (msg, [c.name for c in msg.columns], convs)
                if known is not None and known[0] == msg:
                    continue  # the same relation again (a repeated peek): its key is known
                # The catalog's primary key, in its order, is filled in by stream(); until then (and
                # for a table without one) the replica identity's key flags, unless identity is full
                # (then every column is flagged).
                flagged = [c.name for c in msg.columns if c.key] if msg.replica_identity in ("d", "i") else []
                self.keys[msg.relid] = flagged
                self.unresolved.add(msg.relid)
            elif isinstance(msg, Commit):
                if not skipping and begin is not None:
                    if changes:
                        txs.append((begin.xid, msg.commit_lsn, msg.end_lsn, begin.commit_ts, safe, changes))
                    self.last_commit = msg.commit_lsn
                    self.pending.append((msg.end_lsn, count))
                    safe = msg.end_lsn
                begin, skipping, changes = None, False, []
            elif skipping or begin is None:
                continue
            elif isinstance(msg, Change):
                rel, names, convs = self._relation(msg.relid, int(lsn))
                before = row(names, convs, msg.old) if msg.old is not None else None
                after = row(names, convs, msg.new) if msg.new is not None else None
                changes.append((msg.op, rel.namespace, rel.name, before, after, self.keys[msg.relid]))
            elif isinstance(msg, Truncate):
                for relid in msg.relids:
                    rel = self._relation(relid, int(lsn))[0]
                    changes.append(("t", rel.namespace, rel.name, None, None, []))
        return txs

    def _relation(self, relid: int, lsn: int) -> tuple[Relation, list[str], list[Any]]:
        hit = self.relations.get(relid)
        if hit is None:
            raise DecodeError(lsn, f"change for relation {relid} before its Relation message")
        return hit


class DecoderSettings(TypedDict):
    """What the reader hands this process (pickled on its stdin)."""

    dsn: str
    slot: str
    publication: str
    chunk: int
    heartbeat_s: float
    idle_s: float
    last_commit: int


async def stream(cfg: DecoderSettings, out: IO[bytes]) -> None:
    import asyncpg

    conn = await asyncpg.connect(cfg["dsn"], timeout=10, server_settings=SESSION)
    slot, publication, chunk = cfg["slot"], cfg["publication"], int(cfg["chunk"])
    tx = TxDecoder(int(cfg["last_commit"]))
    last_heartbeat = time.monotonic()
    while True:
        confirmed = await conn.fetchval(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", slot
        )
        if confirmed is None:
            write_frame(out, ("error", "position_lost", f"replication slot {slot!r} is gone (dropped?)"))
            return
        repeat = tx.confirmed(int(confirmed))
        # The flush position, read before the peek: logical decoding reads only flushed WAL, so a
        # heartbeat at the write position could pass a commit that is written but not yet flushed
        # (asynchronous commit) and the slot would be advanced past it.
        wal_now = int(await conn.fetchval("SELECT pg_current_wal_flush_lsn()"))
        try:
            rows = await conn.fetch(PEEK, slot, repeat + chunk, publication)
        except asyncpg.ObjectInUseError:
            await asyncio.sleep(0.005)  # the parent is advancing the slot
            continue
        txs = tx.decode(rows, int(confirmed))
        for relid in tx.unresolved:  # filled in place: the changes hold the same lists
            if pk := [r[0] for r in await conn.fetch(PRIMARY_KEY, relid)]:
                tx.keys[relid][:] = pk
        tx.unresolved.clear()
        if txs:
            write_frame(out, ("txs", txs))
            continue
        idle = not tx.pending and wal_now > int(confirmed)
        if idle and time.monotonic() - last_heartbeat >= cfg["heartbeat_s"]:
            last_heartbeat = time.monotonic()
            tx.pending.append((wal_now, 0))
            write_frame(out, ("heartbeat", wal_now))
        await asyncio.sleep(cfg["idle_s"])


def main() -> None:
    cfg, out = child_setup()
    try:
        asyncio.run(stream(cfg, out))
    except BrokenPipeError:
        return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        import asyncpg

        if isinstance(exc, asyncpg.UndefinedObjectError):
            frame = ("error", "position_lost", f"replication slot {cfg['slot']!r} is gone ({exc})")
        elif isinstance(exc, DecodeError):
            frame = ("error", "decode", str(exc))
        elif is_unavailable(exc):
            frame = ("error", "unavailable", describe(exc))
        else:
            frame = ("error", "source", f"{type(exc).__name__}: {exc}")
        try:
            write_frame(out, frame)
        except BrokenPipeError:
            pass


if __name__ == "__main__":
    main()
