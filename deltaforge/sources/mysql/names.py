"""MySQL/MariaDB identifiers in SQL text."""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """``name`` as a backquoted identifier (a backquote in it doubled)."""
    return "`" + name.replace("`", "``") + "`"
