"""Where a PostgreSQL reader stands in the WAL."""

from __future__ import annotations

from typing import NamedTuple

from deltaforge.position import PositionDoc, after_resets, as_int

END = 1 << 31
"""The ``seq`` of a transaction's end: after every event in it."""


class PgPosition(NamedTuple):
    """``commit_lsn``/``seq``: a change's transaction (by commit LSN, the order transactions
    arrive in) and its index there (``END`` once the transaction is complete); ``lsn``: the
    end of the last *complete* transaction, where the slot may safely be advanced to."""

    lsn: int
    commit_lsn: int
    seq: int = END
    commit_ts: int = 0
    """The transaction's commit time as pgoutput sends it (µs since 2000-01-01); 0: none known (a
    checkpoint written before it was kept). A server restored from a copy of its files writes new
    transactions at LSNs it had used, even the same commit and end LSN: the time tells them apart
    (``slot.check_same_commit``)."""
    last_tx: int = 0
    """A heartbeat's: the commit LSN of the last transaction before it, whose time ``commit_ts`` is
    (a heartbeat names no transaction of its own). 0: ``commit_ts`` is ``commit_lsn``'s."""
    quiet: int = 0
    """A heartbeat's, 1 when ``last_tx`` is the last commit of *any* transaction the stream sent
    before ``lsn`` (its decoder saw them all, including those holding nothing deltaforge hands
    out): then no transaction commits between the two, and a check may ask the slot for none
    (``slot.check_same_commit``). 0 for heartbeats whose decoder had not seen that far back."""
    resets: int = 0
    """``Source.resets`` when it was read: a server restored from an older copy writes at LSNs
    the sinks have passed."""

    @property
    def order(self) -> tuple[int, ...]:
        return after_resets(self.resets, (self.commit_lsn, self.seq))

    @property
    def last_commit(self) -> tuple[int, int] | None:
        """``(commit LSN, commit time)`` of the transaction this position names, or a heartbeat's
        last one before it; None when its time is not known."""
        return (self.last_tx or self.commit_lsn, self.commit_ts) if self.commit_ts else None

    def to_doc(self) -> PositionDoc:
        doc: PositionDoc = {"lsn": self.lsn, "commit_lsn": self.commit_lsn, "seq": self.seq}
        if self.commit_ts:
            doc["commit_ts"] = self.commit_ts  # absent when unknown: older versions read it unchanged
        if self.last_tx:
            doc["last_tx"] = self.last_tx
        if self.quiet:
            doc["quiet"] = self.quiet
        if self.resets:
            doc["resets"] = self.resets
        return doc

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> PgPosition:
        return cls(
            as_int(doc, "lsn"),
            as_int(doc, "commit_lsn"),
            as_int(doc, "seq", END),
            as_int(doc, "commit_ts", 0),
            as_int(doc, "last_tx", 0),
            as_int(doc, "quiet", 0),
            as_int(doc, "resets", 0),
        )
