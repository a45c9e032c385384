"""MySQL/MariaDB identifiers in SQL text."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence


def quote_ident(name: str) -> str:
    """``name`` as a backquoted identifier (a backquote in it doubled)."""
    return "`" + name.replace("`", "``") + "`"


def matches(patterns: Sequence[tuple[str, ...]], db: str, table: str, fold: bool) -> bool:
    """Whether ``db.table`` is one of ``patterns`` (``(db, table)`` globs; none: every table), in
    any case when the server folds names (``lower_case_table_names``)."""
    if not patterns:
        return True
    if fold:
        db, table = db.lower(), table.lower()
        return any(
            fnmatch.fnmatchcase(db, p[0].lower()) and fnmatch.fnmatchcase(table, p[-1].lower())
            for p in patterns
        )
    return any(fnmatch.fnmatchcase(db, p[0]) and fnmatch.fnmatchcase(table, p[-1]) for p in patterns)
