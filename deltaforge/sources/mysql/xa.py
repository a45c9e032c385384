"""XA transactions in the binlog: rows written at XA PREPARE, delivered at XA COMMIT.

``XA START … XA END … XA PREPARE`` puts a transaction's rows in the binlog without a
COMMIT; ``XA COMMIT`` (or ``XA ROLLBACK``) comes later in a group of its own, possibly
after other transactions. The rows wait here until then and are handed on at the
commit, in commit order, re-stamped with the commit's position (so they sort after
everything committed before it); a rollback drops them.

While any XA transaction is prepared and not yet resolved, positions keep the GTID
state from before its XA PREPARE (MariaDB resumes by GTID): a restart then reads
the prepared rows again instead of starting past them.
"""

from __future__ import annotations

from typing import Any

Row = tuple[Any, ...]  # (op, schema, table, pos, row, ts, before, after)


def xa_key(query: str, verb: str) -> str | None:
    """The xid of ``XA <verb> X'..',X'..',n`` (as the binlog spells it), or None."""
    text = query.strip()
    head = f"XA {verb} "
    if text[: len(head)].upper() != head:
        return None
    key = text[len(head) :].strip()
    return None if key.upper().endswith("ONE PHASE") else key


class PreparedXa:
    """XA transactions prepared and not yet committed or rolled back."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[list[Row], str]] = {}

    def prepared(self, key: str, rows: list[Row], state_before: str) -> None:
        self._open[key] = (rows, state_before)

    def committed(self, key: str, pos: int) -> list[Row] | None:
        """The rows of ``key``, now at the commit's position ``pos``; None if it was never seen."""
        held = self._open.pop(key, None)
        if held is None:
            return None
        return [(r[0], r[1], r[2], pos, n, r[5], r[6], r[7]) for n, r in enumerate(held[0])]

    def rolled_back(self, key: str) -> None:
        self._open.pop(key, None)

    def held_state(self) -> str | None:
        """The GTID state before the oldest open XA PREPARE, while one is open."""
        return next(iter(self._open.values()))[1] if self._open else None
