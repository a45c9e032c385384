"""Statements in the binlog that change rows without row events.

With ``binlog_format=ROW`` every INSERT, UPDATE and DELETE is logged as row events, but
``TRUNCATE TABLE`` is always logged as the statement (a query event): ignored, a truncated
table's rows stayed in every sink. It becomes an ``op: t`` event, as PostgreSQL's TRUNCATE
does. An INSERT, UPDATE, DELETE, REPLACE or LOAD DATA logged as a statement means a session
wrote with ``binlog_format`` STATEMENT or MIXED (``SET SESSION binlog_format``, or the global
setting changed after the reader started): its rows are not in the binlog at all, and the
reader halts rather than skip them.

    >>> truncated("/* app */ TRUNCATE TABLE `shop`.`order``s`", "other")
    ('shop', 'order`s')
    >>> truncated("truncate t", "shop")
    ('shop', 't')
    >>> truncated("TRUNCATE shop.t", "")
    ('shop', 't')
    >>> truncated("DELETE FROM t", "shop") is None
    True
    >>> statement_dml("INSERT INTO t VALUES (1)"), statement_dml("CREATE TABLE t (id int)")
    ('INSERT', None)
    >>> may_touch("UPDATE orders SET paid = 1", "shop", [("shop", "orders")])
    True
    >>> may_touch("UPDATE audit.orders_log SET seen = 1", "shop", [("shop", "orders")])
    False
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_IDENT = r"(?:`(?:[^`]|``)+`|[0-9A-Za-z_$\u0080-\uffff]+)"
_COMMENTS = re.compile(r"(?:\s+|/\*(?!!).*?\*/|(?:--\s|#)[^\n]*(?:\n|$))*", re.S)
_TRUNCATE = re.compile(
    rf"TRUNCATE\s+(?:TABLE\s+)?({_IDENT})(?:\s*\.\s*({_IDENT}))?(?:\s+(?:WAIT\s+\d+|NOWAIT))?\s*;?\s*$",
    re.I | re.S,
)
_VERB = re.compile(r"(TRUNCATE|INSERT|UPDATE|DELETE|REPLACE|LOAD)\b", re.I)


class UnreadableTruncate(Exception):
    """A TRUNCATE whose table cannot be told: it may have emptied a captured table."""


class Unreadable(Exception):
    """A statement whose changes cannot be delivered: what it is (``str``), then why and what to do
    (``why``); the decoder puts where it is in between and halts."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(what)
        self.why = why


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def _body(query: str) -> str:
    """``query`` after its leading comments and white space."""
    match = _COMMENTS.match(query)
    return query[match.end() :] if match else query


def truncated(query: str, default_db: str) -> tuple[str, str] | None:
    """``(db, table)`` a ``TRUNCATE`` statement empties (its table named alone is in
    ``default_db``, the session's database the query event carries), or None for any other
    statement; :class:`UnreadableTruncate` for a TRUNCATE whose table cannot be told."""
    body = _body(query)
    if body[:8].upper() != "TRUNCATE":
        return None
    match = _TRUNCATE.match(body)
    if match is None:
        raise UnreadableTruncate(body[:200])
    first, second = match.group(1), match.group(2)
    if second is None:
        return default_db, _unquote(first)
    return _unquote(first), _unquote(second)


def statement_dml(query: str) -> str | None:
    """The verb of an INSERT, UPDATE, DELETE, REPLACE or LOAD DATA logged as a statement, else None."""
    match = _VERB.match(_body(query))
    if match is None or match.group(1).upper() == "TRUNCATE":
        return None
    return match.group(1).upper()


def may_touch(query: str, default_db: str, patterns: list[tuple[str, ...]]) -> bool:
    """Whether a statement could change a table the reader captures (``patterns``: ``(db, table)``
    globs; none: every table). A statement is not parsed: a captured table's name appearing in it
    (its database being the session's or named too) is enough, and a glob matches anything.
    Wrongly yes halts a misconfigured server's reader; wrongly no would skip rows silently."""
    if not patterns:
        return True
    return any(
        _named(pattern[-1], query) and (pattern[0] == default_db or _named(pattern[0], query))
        for pattern in patterns
    )


def _named(name: str, query: str) -> bool:
    if any(ch in name for ch in "*?["):
        return True
    return re.search(rf"(?<![0-9A-Za-z_$]){re.escape(name)}(?![0-9A-Za-z_$])", query, re.I) is not None


def rows_of_statement(
    ev: Any, tx: list[tuple[Any, ...]], named: Callable[[str, str], tuple[str, str] | None],
    patterns: list[tuple[str, ...]],
) -> bool:  # fmt: skip
    """A query event ``ev`` (not BEGIN) that changes rows without row events: a TRUNCATE of a
    captured table (``named`` says which, as row events name it) joins ``tx`` as ``op: t``; True if
    it ends its group (TRUNCATE commits on its own, and MySQL writes no XID after it). A DML
    statement that may touch a captured table raises :class:`Unreadable`: its rows are not in the
    binlog."""
    query, pos = ev.query, int(ev.packet.log_pos)
    db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema)
    try:
        target = truncated(query, db)
    except UnreadableTruncate as exc:
        raise Unreadable(
            "a TRUNCATE",
            f"whose table cannot be told ({exc}): it may have emptied a captured table; re-snapshot the "
            "captured tables from a position after it",
        ) from None
    if target is not None:
        if (table := named(*target)) is not None:
            tx.append(("t", table[0], table[1], pos, 0, int(ev.timestamp), None, None))
        return True
    verb = statement_dml(query)
    if verb is not None and may_touch(query, db, patterns):
        raise Unreadable(
            f"{verb} logged as a statement",
            f"(session database {db!r}): a session wrote with binlog_format STATEMENT or MIXED, so its rows "
            "are not in the binlog and cannot be delivered; set binlog_format=ROW globally, keep clients "
            "from SET SESSION binlog_format (it needs SUPER or BINLOG ADMIN), and re-snapshot the tables it "
            "changed from a position after it",
        )
    return False
