"""The pgoutput decoder process: streams the slot, decodes, converts values (see ``childproc.py``).

Frames it writes:

* ``("txs", [(xid, commit_lsn, end_lsn, commit_ts_us, safe_lsn, [(op, schema, table, before, after), ...]), ...])``
  — complete transactions in commit order; ``safe_lsn`` is the end of the last
  complete transaction before this one (where the slot may be advanced to);
* ``("heartbeat", lsn, seen)`` — nothing of ours committed before ``lsn``; ``seen``: the
  commit LSN and time of the last transaction the stream sent before it, whatever it held, or
  None when none was sent since the stream started and the parent did not say which was;
* ``("ahead", more)`` — when it changes, before the ``txs`` frame it is about (if any): whether the stream had
  already sent more when it was written (more follows at once; ``childframes.AHEAD``);
* ``("keyless", table, primary_key, identity)`` — the table's replica identity is an index that
  leaves out some of its primary key: its deletes cannot carry the key;
* ``("error", kind, message)`` with kind ``position_lost``, ``decode``, ``unavailable`` or
  ``source``, then exit.

It reads the slot with the streaming replication protocol (``replication.py``):
each change is decoded once, however long sinks take. The slot moves only to
what the parent confirms (``("confirm", lsn)`` frames on stdin, sent once every
sink holds a checkpoint durably). Transactions at or before ``last_commit``
(handed out before a restart) are recognised by their commit LSN and skipped.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, TypedDict

from deltaforge.position import PositionDoc
from deltaforge.snapshot.window import WATERMARK_PREFIX
from deltaforge.sources.childframes import Ahead, read_frame, write_frame
from deltaforge.sources.childside import child_setup, log_crash
from deltaforge.sources.postgres.catalog import Catalog
from deltaforge.sources.postgres.frames import frame_sender
from deltaforge.sources.postgres.holder import busy, walsender
from deltaforge.sources.postgres.names import PRIMARY_KEY
from deltaforge.sources.postgres.pgoutput import (
    Begin,
    Change,
    Commit,
    DecodeError,
    LogicalMessage,
    Relation,
    Truncate,
    decode,
    parse_lsn,
)
from deltaforge.sources.postgres.position import PgPosition
from deltaforge.sources.postgres.replication import LogicalStream, StreamError
from deltaforge.sources.postgres.rows import RowBuilder, row_builder
from deltaforge.sources.postgres.values import SESSION, TYPES, Types

NOT_LOGGED = "__not_logged__"
"""The key of the marker ``{"__not_logged__": True}``: a value the change does not carry."""


Tx = tuple[int, int, int | None, int, int, list[tuple[Any, ...]], int]
"""``(xid, commit_lsn, end_lsn, commit_ts, safe, changes, first)``: changes of one transaction,
the first of them its ``first``-th; ``end_lsn`` is None until the piece that ends it."""


class TxDecoder:
    """pgoutput messages to transactions, skipping those already handed out.

    A transaction may span several reads. One larger than ``piece`` changes is handed out in
    pieces as it is read, not held until its Commit: a million-row UPDATE held whole took
    gigabytes here and again in the parent. pgoutput sends a transaction only once it has
    committed, and its Begin already says the commit LSN and time, so a piece is final; the last
    change is kept back for the piece that ends it (it carries ``tx_end``).
    """

    def __init__(
        self,
        last_commit: int,
        safe: int,
        piece: int = 1 << 62,
        seen: tuple[int, int] | None = None,
        lookup: Callable[[list[int]], Iterable[Sequence[Any]]] | None = None,
    ) -> None:
        self.piece = piece
        self.types = Types()
        self.lookup = lookup
        """Runs :data:`TYPES` for OIDs a relation's columns need looked up (none: built-in types only)."""
        self.seen = seen
        """Commit LSN and time of the last transaction pgoutput sent, whatever it held (a heartbeat
        says it: a restored server's new transactions before the heartbeat are found by it)."""
        self.first = 0
        self.last_commit = last_commit
        self.safe = safe
        """End of the last complete transaction (or heartbeat): where the slot may be advanced to."""
        self.relations: dict[int, tuple[Relation, RowBuilder]] = {}
        """Each relation's last Relation message, with the function making its rows' dicts."""
        self.keys: dict[int, list[str]] = {}
        """Each relation's primary-key columns (one list, shared by its changes)."""
        self.not_key: dict[int, list[str]] = {}
        """Each relation's columns outside its replica identity's key."""
        self.unresolved: set[int] = set()
        """Relations whose primary key is still to be read from the catalog."""
        self.schemas: list[tuple[str, list[dict[str, Any]], PositionDoc]] = []
        """Relations first seen, or with other columns, since the last call: for the schema history."""
        self.begin: Begin | None = None
        self.skipping = False
        self.changes: list[tuple[Any, ...]] = []

    @property
    def in_transaction(self) -> bool:
        return self.begin is not None

    def decode(self, rows: list[tuple[int, bytes]]) -> list[Tx]:
        txs: list[Tx] = []
        for lsn, data in rows:
            if self.skipping and data[:1] not in (b"C", b"R"):
                continue
            msg = decode(data, lsn)
            if isinstance(msg, Begin):
                self.begin, self.changes, self.first = msg, [], 0
                self.skipping = msg.final_lsn <= self.last_commit
            elif isinstance(msg, Relation):
                self._relation_message(msg)
            elif isinstance(msg, Commit):
                self.seen = (msg.commit_lsn, msg.commit_ts)
                begin = self.begin
                if not self.skipping and begin is not None:
                    if self.changes:
                        txs.append(
                            (begin.xid, msg.commit_lsn, msg.end_lsn, begin.commit_ts, self.safe, self.changes,
                             self.first)
                        )  # fmt: skip
                    self.last_commit = msg.commit_lsn
                self.safe = max(self.safe, msg.end_lsn)
                self.begin, self.skipping, self.changes = None, False, []
            elif self.skipping or self.begin is None:
                continue
            elif isinstance(msg, Change):
                rel, build = self._relation(msg.relid, lsn)
                before = build(msg.old) if msg.old is not None else None
                if msg.key_only and before is not None:
                    # The replica identity's key only (REPLICA IDENTITY DEFAULT or USING INDEX): the
                    # other columns come as null, which they need not be. Say they were not sent.
                    for name in self.not_key[msg.relid]:
                        before[name] = {NOT_LOGGED: True}
                after = build(msg.new) if msg.new is not None else None
                self.changes.append((msg.op, rel.namespace, rel.name, before, after, self.keys[msg.relid]))
                if len(self.changes) > self.piece:
                    self._hand_out_piece(txs)
            elif isinstance(msg, LogicalMessage):
                if msg.prefix == WATERMARK_PREFIX:  # a snapshot watermark (others are not ours)
                    content = msg.content.decode(errors="replace")
                    self.changes.append(("m", "", msg.prefix, None, {"content": content}, []))
            elif isinstance(msg, Truncate):
                for relid in msg.relids:
                    rel = self._relation(relid, lsn)[0]
                    self.changes.append(("t", rel.namespace, rel.name, None, None, []))
        return txs

    def _hand_out_piece(self, txs: list[Tx]) -> None:
        """The open transaction's changes but the last, as a piece (see the class)."""
        begin = self.begin
        assert begin is not None
        piece, self.changes = self.changes[:-1], self.changes[-1:]
        txs.append((begin.xid, begin.final_lsn, None, begin.commit_ts, self.safe, piece, self.first))
        self.first += len(piece)

    def _relation_message(self, msg: Relation) -> None:
        if self.lookup is not None:
            while need := self.types.missing(c.type_oid for c in msg.columns):
                self.types.learn(need, self.lookup(need))
        convs = [None if (f := self.types.converter(c.type_oid)) is str else f for c in msg.columns]
        known = self.relations.get(msg.relid)
        self.relations[msg.relid] = (msg, row_builder([c.name for c in msg.columns], convs))
        if known is not None and known[0] == msg:
            return  # the same relation again: its key is known
        # Versioned from the transaction it arrives in (pgoutput sends it before the first change).
        begin = self.begin
        at = PgPosition(self.safe, begin.final_lsn if begin is not None else self.safe, 0)
        cols = [{"name": c.name, "type": c.type_oid, "mod": c.type_mod, "key": c.key} for c in msg.columns]
        self.schemas.append((f"{msg.namespace}.{msg.name}", cols, at.to_doc()))
        # The catalog's primary key, in its order, is filled in by stream(); until then (and for a
        # table without one) the replica identity's key flags, unless identity is full (then every
        # column is flagged).
        flagged = [c.name for c in msg.columns if c.key] if msg.replica_identity in ("d", "i") else []
        self.keys[msg.relid] = flagged
        self.not_key[msg.relid] = [c.name for c in msg.columns if not c.key]
        self.unresolved.add(msg.relid)

    def _relation(self, relid: int, lsn: int) -> tuple[Relation, RowBuilder]:
        hit = self.relations.get(relid)
        if hit is None:
            raise DecodeError(lsn, f"change for relation {relid} before its Relation message")
        return hit


class DecoderSettings(TypedDict):
    """What the reader hands this process (the first frame on its stdin)."""

    dsn: str
    slot: str
    publication: str
    chunk: int
    heartbeat_s: float
    idle_s: float
    silence_s: float
    catalog_idle_s: float
    """How long the catalog connection may idle, or leave a question unanswered (``Catalog``)."""
    last_commit: int
    envelopes: dict[str, Any] | None
    """``Transactions.opening()`` when this child makes each change's native envelope, record key
    and idempotency key too (``Event.made``; frames.py, sources/made.py)."""
    seen: tuple[int, int, int] | None
    """``(lsn, commit LSN, commit time)``: the last transaction the stream sends before ``lsn``, as
    the checkpoint opened from says; used when the stream starts at ``lsn`` (the slot was moved
    there)."""


class Confirmations:
    """What the parent says sinks hold durably: ``("confirm", lsn)`` frames on stdin, read by a
    thread. ``lsn`` only grows; ``closed`` is set when the parent closes the pipe (stop)."""

    def __init__(self, inp: IO[bytes]) -> None:
        self.lsn = 0
        self.closed = False
        threading.Thread(target=self._read, args=(inp,), name="confirmations", daemon=True).start()

    def _read(self, inp: IO[bytes]) -> None:
        try:
            while True:
                kind, lsn = read_frame(inp)
                if kind == "confirm" and lsn > self.lsn:
                    self.lsn = lsn  # one int, written by this thread only
        except (EOFError, OSError, ValueError):
            self.closed = True


def stream(cfg: DecoderSettings, out: IO[bytes], confirmations: Confirmations) -> None:
    slot, chunk = cfg["slot"], int(cfg["chunk"])
    catalog = Catalog(cfg["dsn"], float(cfg["catalog_idle_s"]))
    found = next(
        iter(
            catalog.rows(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
        ),
        None,
    )
    if found is None or found[0] is None:
        write_frame(out, ("error", "position_lost", f"replication slot {slot!r} is gone (dropped?)"))
        return
    start = parse_lsn(found[0])
    repl = _start(cfg, start, catalog)
    if (ours := walsender(slot, catalog.rows)) is not None:
        write_frame(out, ("walsender", *ours))  # ended at the next opening if still holding the slot
    known = cfg["seen"]
    tx = TxDecoder(
        int(cfg["last_commit"]), start, chunk, known[1:] if known and known[0] == start else None,
        lambda oids: catalog.rows(TYPES, (oids,)),
    )  # fmt: skip
    send = frame_sender(cfg["envelopes"], out)
    last_heartbeat = asked_at = time.monotonic()
    ahead: list[tuple[int, bytes]] = []
    said = Ahead(out)
    while not confirmations.closed:
        repl.confirm(confirmations.lsn)
        rows, ahead = ahead or repl.read(chunk, cfg["idle_s"]), []
        txs = tx.decode(rows)
        for relid in tx.unresolved:  # filled in place: the changes hold the same lists
            if pk := [r[0] for r in catalog.rows(PRIMARY_KEY, (relid,))]:
                flagged, rel = tx.keys[relid], tx.relations[relid][0]
                if rel.replica_identity == "i" and not set(pk) <= set(flagged):
                    write_frame(out, ("keyless", f"{rel.namespace}.{rel.name}", pk, list(flagged)))
                # The catalog is read now and knows only the newest key. Under the default replica
                # identity the relation's flags are the primary key as the changes were written:
                # the catalog gives its order, unless the key has moved since (then the flags stand).
                if rel.replica_identity != "d" or sorted(pk) == sorted(flagged):
                    flagged[:] = pk
        tx.unresolved.clear()
        for table, cols, at in tx.schemas:
            write_frame(out, ("schema", table, cols, at))
        tx.schemas.clear()
        if txs or said.more:
            # One read ends where libpq's buffer does, about a transaction of a backlog: what has
            # arrived meanwhile is taken now, and the frame says whether more follows at once.
            # Only when none does is the reader caught up, so a backlog's batches fill to
            # max_events instead of one a frame (docs/performance.md).
            ahead = repl.arrived(chunk)
            said.say(bool(ahead))
        if txs:
            send(txs)
        if rows or ahead or tx.in_transaction:
            continue
        now = time.monotonic()
        if now - last_heartbeat < cfg["heartbeat_s"]:
            continue
        # Idle: the keepalive's WAL end is where decoding stands, and decoding reads only flushed
        # WAL. Nothing of ours committed before it unsent, so checkpoints (and the slot) may move
        # there. It is never past the flush position, whatever synchronous_commit is.
        if repl.wal_end > tx.safe:
            tx.safe = repl.wal_end
            last_heartbeat = now
            write_frame(out, ("heartbeat", repl.wal_end, tx.seen))
        elif now - asked_at >= cfg["heartbeat_s"]:
            asked_at = now
            repl.status(reply=True)  # ask for a keepalive: a fresh WAL end


BUSY_GRACE_S = 5.0
"""How long a slot held by another connection is waited for here, silently, before it is said:
the walsender of a reader of this pipeline that just went lets go once it notices."""


def _start(cfg: DecoderSettings, start: int, catalog: Catalog) -> LogicalStream:
    """Open the stream. A slot another connection holds is waited for ``BUSY_GRACE_S`` (the
    walsender of a reader that just stopped lets go once it notices); after that the slot is
    unavailable, saying who holds it: another pipeline given the same slot (two teams' configs
    with the default ``deltaforge``) would otherwise hold this one back without a word."""
    deadline = time.monotonic() + BUSY_GRACE_S
    while True:
        repl = LogicalStream(cfg["dsn"], SESSION, cfg["silence_s"])
        try:
            repl.start(cfg["slot"], cfg["publication"], start)
            return repl
        except StreamError as exc:
            repl.close()
            if not exc.slot_busy:
                raise
            if time.monotonic() >= deadline:
                raise StreamError(busy(cfg["slot"], catalog.rows), exc.sqlstate) from None
            time.sleep(0.1)


def main() -> None:
    try:
        report()
    finally:
        # The confirmations thread is blocked reading stdin: a normal interpreter shutdown would
        # wait for its lock and abort. Everything worth saying has been written and flushed.
        os._exit(0)


def report() -> None:
    """Stream, and report how it ended to the parent."""
    cfg, out = child_setup(warm=("psycopg",))
    try:
        stream(cfg, out, Confirmations(sys.stdin.buffer))
    except BrokenPipeError:
        return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        if isinstance(exc, StreamError) and exc.slot_missing:
            frame = ("error", "position_lost", f"replication slot {cfg['slot']!r} is gone ({exc})")
        elif isinstance(exc, DecodeError):
            frame = ("error", "decode", str(exc))
        elif isinstance(exc, StreamError) and exc.slot_busy:
            frame = ("error", "unavailable", str(exc))
        elif (isinstance(exc, StreamError) and exc.unavailable) or isinstance(exc, OSError):
            frame = ("error", "unavailable", f"{type(exc).__name__}: {exc}")
        else:
            log_crash(exc)
            frame = ("error", "source", f"{type(exc).__name__}: {exc}")
        try:
            write_frame(out, frame)
        except BrokenPipeError:
            pass


if __name__ == "__main__":
    main()
