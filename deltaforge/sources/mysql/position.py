"""Where a MySQL/MariaDB reader stands in the binlog."""

from __future__ import annotations

import re
from typing import NamedTuple

from deltaforge.position import PositionDoc, as_int, as_str

_INDEX = re.compile(r"\.(\d+)$")


def binlog_index(name: str) -> int:
    """``mysql-bin.000042`` -> 42 (0 for a name without a number)."""
    m = _INDEX.search(name)
    return int(m.group(1)) if m else 0


class BinlogPosition(NamedTuple):
    """``file``/``pos``: the end of a row event (or, at a transaction's end, of its XID
    event); ``row``: the row's index in that event; ``gtid``: the last committed
    transaction's GTID (MariaDB resumes from it); ``tx_start``: inside a transaction,
    where it began in ``file`` (a resume by file and position starts there and sinks skip
    what they hold; 0 at a transaction's end); ``gen``: the failover generation, how many
    times reading moved to another server, plus how many times the position was lost and
    reading began again from now (``Source.resets``). Binlog coordinates mean nothing on
    another server, nor after ``RESET MASTER``, so the generation leads the order: everything
    read after a failover or a reset sorts after everything read before it."""

    file: str
    pos: int
    row: int = 0
    gtid: str = ""
    tx_start: int = 0
    gen: int = 0

    @property
    def resume_pos(self) -> int:
        """Where a resume by file and position starts: this transaction's beginning, if inside one."""
        return self.tx_start or self.pos

    @property
    def order(self) -> tuple[int, ...]:
        return (self.gen, binlog_index(self.file), self.pos, self.row)

    def to_doc(self) -> PositionDoc:
        doc: PositionDoc = {"file": self.file, "pos": self.pos, "row": self.row, "gtid": self.gtid}
        if self.tx_start:
            doc["tx_start"] = self.tx_start
        if self.gen:
            doc["gen"] = self.gen
        return doc

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> BinlogPosition:
        return cls(
            as_str(doc, "file"),
            as_int(doc, "pos"),
            as_int(doc, "row"),
            as_str(doc, "gtid"),
            as_int(doc, "tx_start"),
            as_int(doc, "gen"),
        )
