"""Where a Turso reader stands in ``turso_cdc``."""

from __future__ import annotations

from typing import NamedTuple

from deltaforge.position import PositionDoc, as_int


class TursoPosition(NamedTuple):
    """``change_id``: the last ``turso_cdc`` row read (a transaction's end marker at its end)."""

    change_id: int

    @property
    def order(self) -> tuple[int, ...]:
        return (self.change_id,)

    def to_doc(self) -> PositionDoc:
        return {"change_id": self.change_id}

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> TursoPosition:
        return cls(as_int(doc, "change_id"))
