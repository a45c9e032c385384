"""Noticing a sink's server that lost what it acknowledged.

A checkpoint moves once a sink's server acknowledges a batch, and what it moved past is never
sent again. A server can still lose acknowledged data afterwards: Redis restarted without
``appendfsync always`` (by default it keeps nothing since its last RDB save), a JetStream stream
in memory, or deleted and made again. ``durability.py`` names the settings that allow it at start;
this names it when it happens, from what the server says as it takes the next batch.

Each place a sink appends to (a Redis stream, a JetStream stream) numbers its entries in
increasing order, and never reuses a number while it keeps what it acknowledged: the
next batch finds the server's end where the last one left it, or further (other writers). An end
behind the furthest number this sink was acknowledged means entries it acknowledged are gone.
The sink cannot send them again (the checkpoint has moved past them; the source may no longer
have them): it says so, once per loss, with what to do. The marks are kept in the checkpoint
store between runs (``pipeline/heldends.py``), so a loss while deltaforge was stopped is named
at the next run's first batch, as long as the sink writes to the same servers.

Kafka's sink asks librdkafka for failed records' reports only (``delivery.report.only.error``, for
throughput), so the offsets a batch was given are not seen: in its default mode it reads where its
partitions end instead (``kafka_ends.py``, with this class); under ``exactly_once`` its delivery
worker compares the position record the sink commits with each batch (``pipeline/delivery.py``).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

import structlog

Mark = TypeVar("Mark", int, tuple[int, int])
"""A server's number for an entry: a JetStream sequence, or a Redis stream ID ``(ms, seq)``."""


class AckedEnds(Generic[Mark]):
    """The furthest mark each place acknowledged to one sink in this run.

    >>> ends = AckedEnds[int]("n", "NatsSink", "stream sequence")
    >>> ends.check("CDC", 0, 41)  # first batch: nothing to compare with
    False
    >>> ends.check("CDC", 41, 99)  # the stream ended where the last batch left it
    False
    >>> from structlog.testing import capture_logs
    >>> with capture_logs() as said:
    ...     ends.check("CDC", 9, 20)  # it ends at 9 now: 10..99 are gone
    True
    >>> [(e["event"], e["log_level"], e["acknowledged"], e["now_ends_at"]) for e in said]
    [('sink_lost_acknowledged', 'error', '99', '9')]
    >>> ends.check("CDC", 20, 25)  # said once
    False
    """

    def __init__(self, sink: str, actor: str, unit: str) -> None:
        self.sink, self.actor, self.unit = sink, actor, unit
        self.ends: dict[str, Mark] = {}

    def to_doc(self) -> dict[str, Any]:
        """The marks as JSON values (a Redis ID as ``[ms, seq]``), for the checkpoint store.

        >>> AckedEnds[tuple[int, int]]("r", "RedisSink", "ID").restore({"cdc": [17, 2]}).to_doc()
        {'cdc': [17, 2]}
        """
        return {where: list(mark) if isinstance(mark, tuple) else mark for where, mark in self.ends.items()}

    def restore(self, doc: dict[str, Any]) -> AckedEnds[Mark]:
        """Marks kept by an earlier run (:meth:`to_doc`): this run's batches are compared with them
        (a mark this run has already moved past stays)."""
        for where, kept in doc.items():
            mark = cast(Mark, tuple(kept) if isinstance(kept, list) else kept)
            held = self.ends.get(where)
            self.ends[where] = mark if held is None else max(held, mark)
        return self

    def check(self, where: str, before: Mark, after: Mark) -> bool:
        """The server said ``where`` ended at ``before`` when this batch was added, and at ``after``
        once it was. True, and logged, when ``before`` is behind what it acknowledged already."""
        held = self.ends.get(where)
        lost = held is not None and before < held
        if lost:
            structlog.get_logger().error(
                "sink_lost_acknowledged", actor=self.actor, sink=self.sink, where=where,
                acknowledged=_text(held), now_ends_at=_text(before),
                reason=f"the server no longer has entries it acknowledged (up to {self.unit} "
                f"{_text(held)}): it lost them, or they were deleted. deltaforge does not send them "
                "again (its checkpoint is past them): snapshot the tables they came from again",
            )  # fmt: skip
        self.ends[where] = after if lost or held is None else max(held, after)
        return lost


def _text(mark: object) -> str:
    return f"{mark[0]}-{mark[1]}" if isinstance(mark, tuple) else str(mark)
