"""The PostgreSQL decoder child's transactions as events, in ``serve`` (the pump thread builds
them as frames arrive): positions made without their Python-level constructors, one per
event, and the last transaction handed out, which heartbeats' checkpoints and the next opening
start from. The child makes the same events of the same frames when it makes the Kafka records
too (:func:`frame_sender`, ``sources/made.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, Any

from deltaforge.events import Event, Made, SourceInfo, new_event, new_source_info
from deltaforge.position import after_resets
from deltaforge.sources.childframes import write_frame
from deltaforge.sources.postgres.pgoutput import format_lsn
from deltaforge.sources.postgres.position import END, PgPosition

# A NamedTuple made without its Python-level __new__ (one per event): every field must be given.
new_position = tuple.__new__
PG_EPOCH_MS = 946_684_800_000  # 2000-01-01 in Unix milliseconds


class Transactions:
    """Decoded transactions of one database as events."""

    def __init__(self, connector: str, tenant: str) -> None:
        self.connector = connector
        self.tenant = tenant
        self.db = ""
        self.last_commit = 0
        """Commit LSN of the last transaction handed out."""
        self.last_time: tuple[int, int] | None = None
        """Its commit LSN and time, when known."""
        self.resets = 0
        """``Source.resets`` of this opening: every position made carries it."""

    def opening(self) -> dict[str, Any]:
        """What the decoder child needs to make the same events (:func:`frame_sender`)."""
        return {"connector": self.connector, "tenant": self.tenant, "db": self.db, "resets": self.resets}

    def heartbeat(self, lsn: int, seen: tuple[int, int] | None) -> Event:
        """No change of ours committed before ``lsn``: let checkpoints (and so the slot) move there.
        ``seen``: the last transaction the stream sent before it, whatever it held."""
        # It carries the last transaction's commit time: a restored server is checked against it.
        resets = self.resets
        if seen is not None:
            cp = PgPosition(lsn, lsn - 1, END, seen[1], seen[0], quiet=1, resets=resets)
        elif (last := self.last_time) is not None:
            cp = PgPosition(lsn, lsn - 1, END, last[1], last[0], resets=resets)
        else:
            cp = PgPosition(lsn, lsn - 1, END, resets=resets)
        return Event(
            op="h",
            before=None,
            after=None,
            source=SourceInfo(self.connector, self.db, "", cp, int(time.time() * 1000)),
            tx_id="heartbeat",
            tx_end=True,
            event_id=f"heartbeat:{lsn}",
            order=cp.order,
            checkpoint=cp,
            tenant=self.tenant,
            size=64,
        )

    def events(self, txs: list[tuple[Any, ...]], made: list[Made | None] | None = None) -> list[Event]:
        """The events of ``txs``; ``made``: their records' parts as the child made them, one per event."""
        out: list[Event] = []
        connector, db, tenant, resets = self.connector, self.db, self.tenant, self.resets
        for xid, commit_lsn, end_lsn, commit_ts, safe, changes, first in txs:
            prefix = format_lsn(commit_lsn) if not resets else f"r{resets}:{format_lsn(commit_lsn)}"
            ts_ms = PG_EPOCH_MS + commit_ts // 1000
            tx_id = str(xid)
            # A piece of a transaction still being read (TxDecoder) ends nothing.
            last = first + len(changes) - 1 if end_lsn is not None else -1
            for seq, (op, schema, table, before, after, key) in enumerate(changes, first):
                position = new_position(PgPosition, (safe, commit_lsn, seq, commit_ts, 0, 0, resets))
                end = seq == last
                out.append(
                    new_event(
                        op,
                        before,
                        after,
                        new_source_info(connector, db, table, position, ts_ms, schema, tuple(key)),
                        tx_id,
                        end,
                        f"{prefix}:{seq}",
                        (commit_lsn, seq) if not resets else after_resets(resets, (commit_lsn, seq)),
                        new_position(PgPosition, (end_lsn, commit_lsn, END, commit_ts, 0, 0, resets))
                        if end
                        else position,
                        tenant,
                        128 + 32 * len(after or before or ()),
                        None if made is None else made[len(out)],
                    )
                )
            if end_lsn is not None:
                self.last_commit = commit_lsn
                self.last_time = (commit_lsn, commit_ts)
        return out


def frame_sender(opening: dict[str, Any] | None, out: IO[bytes]) -> Callable[[list[Any]], None]:
    """In the decoder child: what writes its ``txs`` frames. With ``opening``
    (:meth:`Transactions.opening`: the child makes records), each change's native envelope, record
    key and idempotency key go with the frame, made from the events ``serve`` makes of it, the
    same way, from the same opening. The child then makes about 4 µs more an event and ``serve``
    as much less, where its one GIL bound the drain (docs/performance.md)."""
    if not opening:
        return lambda txs: write_frame(out, ("txs", txs))
    from deltaforge.sources.making import txs_sender  # the records' code: only a child that makes them

    events = Transactions(opening["connector"], opening["tenant"])
    events.db, events.resets = opening["db"], opening["resets"]
    return txs_sender(out, events.events)
