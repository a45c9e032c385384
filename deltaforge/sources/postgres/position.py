"""Where a PostgreSQL reader stands in the WAL."""

from __future__ import annotations

from typing import NamedTuple

from deltaforge.position import PositionDoc, as_int

END = 1 << 31
"""The ``seq`` of a transaction's end: after every event in it."""


class PgPosition(NamedTuple):
    """``commit_lsn``/``seq``: a change's transaction (by commit LSN, the order transactions
    arrive in) and its index there (``END`` once the transaction is complete); ``lsn``: the
    end of the last *complete* transaction, where the slot may safely be advanced to."""

    lsn: int
    commit_lsn: int
    seq: int = END

    @property
    def order(self) -> tuple[int, ...]:
        return (self.commit_lsn, self.seq)

    def to_doc(self) -> PositionDoc:
        return {"lsn": self.lsn, "commit_lsn": self.commit_lsn, "seq": self.seq}

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> PgPosition:
        return cls(as_int(doc, "lsn"), as_int(doc, "commit_lsn"), as_int(doc, "seq", END))
