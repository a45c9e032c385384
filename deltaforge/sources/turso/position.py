"""Where a Turso reader stands in ``turso_cdc``."""

from __future__ import annotations

from typing import NamedTuple

from deltaforge.position import PositionDoc, after_resets, as_int


class TursoPosition(NamedTuple):
    """``change_id``: the last ``turso_cdc`` row read (a transaction's end marker at its end).

    ``txn`` and ``at`` are that row's ``change_txn_id`` and ``change_time``: on resume they
    must still match, or the database was replaced under the checkpoint (positions stored
    before they were recorded have neither, and resume on ``change_id`` alone).

    ``after_snapshot`` is k once the rows of the k-th snapshot window read at this change are
    all in: it orders that point after them (they sort between ``k - 1`` and ``k``), and the
    next window read at the same change after it; a resume reads from after ``change_id``
    either way.
    """

    change_id: int
    txn: int | None = None
    at: int | None = None
    after_snapshot: int = 0
    resets: int = 0
    """``Source.resets`` when it was read: change ids start again once ``turso_cdc`` is emptied."""

    @property
    def order(self) -> tuple[int, ...]:
        return after_resets(self.resets, (self.change_id, self.after_snapshot))

    def to_doc(self) -> PositionDoc:
        doc: PositionDoc = {"change_id": self.change_id}
        if self.txn is not None:
            doc["txn"] = self.txn
        if self.at is not None:
            doc["at"] = self.at
        if self.after_snapshot:
            doc["after_snapshot"] = self.after_snapshot
        if self.resets:
            doc["resets"] = self.resets
        return doc

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> TursoPosition:
        txn = as_int(doc, "txn") if doc.get("txn") is not None else None
        at = as_int(doc, "at") if doc.get("at") is not None else None
        return cls(
            as_int(doc, "change_id"), txn, at, as_int(doc, "after_snapshot", 0), as_int(doc, "resets", 0)
        )
