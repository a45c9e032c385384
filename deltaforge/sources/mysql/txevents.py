"""A MySQL/MariaDB decoder frame's transactions as events.

``serve`` makes the events a source hands on from each ``("txs", ...)`` frame. The decoder child
makes the same events from the same frame before it sends it, when a Kafka sink sends the
``native`` envelope, and sends each change's envelope, record key and idempotency key with the
frame (``Event.made``): they are then made in the child's process, not under ``serve``'s GIL,
where they held the Kafka sink's thread (docs/performance.md). Both sides start from the same
opening (connector, tenant, failover generation, the resume GTID state), learn each table's
primary key from the same schema frames, and read the same frames in the same order, so both
make the same events; ``serve`` still checks the first change of every frame against its own
making (``sources/made.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

from deltaforge.events import Event, Made, SourceInfo, new_event, new_source_info
from deltaforge.sources.childframes import write_frame
from deltaforge.sources.mysql.position import BinlogPosition, binlog_index

new_position = tuple.__new__  # a NamedTuple without its Python-level __new__: one per event


class TxEvents:
    """Events from frames' transactions, in order. ``committed`` is the GTID state of the last
    whole transaction read: the positions of the next transaction's rows carry it."""

    def __init__(
        self, connector: str, tenant: str, gen: int, committed: str, keys: dict[str, tuple[str, ...]]
    ) -> None:
        self.connector = connector
        self.tenant = tenant
        self.gen = gen
        self.committed = committed
        self.keys = keys
        """``"db.table"`` -> primary-key columns, as the schema frames said (serve's pump thread)."""

    def __call__(self, txs: list[tuple[Any, ...]], made: list[Made | None] | None = None) -> list[Event]:
        """The events of ``txs``; ``made``: their records' parts as the child made them, one per event."""
        out: list[Event] = []
        connector, tenant, keys, gen, committed = (
            self.connector,
            self.tenant,
            self.keys,
            self.gen,
            self.committed,
        )
        for gtid, state, file, end_pos, began, rows in txs:
            fidx = binlog_index(file)
            if not rows:  # a transaction on uncaptured tables: moves checkpoints, never delivered
                out.append(self.heartbeat(file, fidx, end_pos, state))
                committed = state
                continue
            # A piece of a transaction still being read (the decoder's piecewise) ends nothing; it
            # has a GTID of its own, so its id is the one the rest of the transaction gets.
            last = len(rows) - 1 if end_pos is not None else -1
            tx_id = gtid or f"{file}:{end_pos}"
            for n, (op, schema, table, pos, i, ts, before, after) in enumerate(rows):
                key = keys.get(f"{schema}.{table}", ())
                position = new_position(BinlogPosition, (file, pos, i, committed, began, gen))
                end = n == last
                out.append(
                    new_event(
                        op,
                        before,
                        after,
                        new_source_info(connector, schema, table, position, ts * 1000, None, key),
                        tx_id,
                        end,
                        f"{fidx}:{pos}:{i}" if not gen else event_id(gen, fidx, pos, i),
                        (gen, fidx, pos, i),
                        new_position(BinlogPosition, (file, end_pos, 0, state, 0, gen)) if end else position,
                        tenant,
                        128 + 32 * len(after or before or ()),
                        None if made is None else made[len(out)],
                    )
                )
            if end_pos is not None:
                committed = state
        self.committed = committed
        return out

    def heartbeat(self, file: str, fidx: int, end_pos: int, gtid: str) -> Event:
        gen = self.gen
        cp = new_position(BinlogPosition, (file, end_pos, 0, gtid, 0, gen))
        return Event(
            "h", None, None, SourceInfo(self.connector, "", "", cp, 0), "heartbeat", True,
            f"heartbeat:{event_id(gen, fidx, end_pos, 0)}", (gen, fidx, end_pos, 0), cp, self.tenant, 64,
        )  # fmt: skip


def event_id(gen: int, fidx: int, pos: int, row: int) -> str:
    """An event's id: its binlog coordinates, after the failover generation once there is one."""
    return f"{fidx}:{pos}:{row}" if not gen else f"g{gen}:{fidx}:{pos}:{row}"


def frame_sender(
    made: dict[str, Any] | None, committed: str, out: IO[bytes], keys: dict[str, tuple[str, ...]]
) -> Callable[[list[Any]], None]:
    """What writes the decoder child's ``txs`` frames. With ``made`` (``connector``, ``tenant``,
    ``gen``: the child makes records), each change's native envelope, record key and idempotency
    key go with the frame (``Event.made``), made from the events ``serve`` makes of it; a change
    whose envelope or key cannot be encoded goes with None, and the sink's own encoding says why.
    ``committed``: the GTID state the child resumes from; ``keys``: each table's primary-key
    columns, as the child's schema frames have told ``serve`` so far (the decoder keeps it)."""
    if not made:
        return lambda pending: write_frame(out, ("txs", pending))
    from deltaforge.sources.making import txs_sender  # the records' code: only a child that makes them

    return txs_sender(out, TxEvents(made["connector"], made["tenant"], made["gen"], committed, keys))
