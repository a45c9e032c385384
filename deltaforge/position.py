"""Positions: where a source stands, as a type per source rather than a dict.

Each source declares its own position type (``BinlogPosition``, ``PgPosition``,
``TursoPosition``): a frozen ``NamedTuple`` with the ordering and the stored form in
one place. A NamedTuple because every event carries one and building it costs what a
dict costs (a frozen dataclass costs five times as much, measured on the MySQL path).

Positions are compared only through :attr:`Position.order`, a tuple of integers that
sorts in source order. The stored form (:meth:`Position.to_doc`) is the small JSON
mapping checkpoints have always held, so a store written by earlier versions still
reads back (``from_doc`` fills fields older versions did not write).

    >>> from deltaforge.sources.turso.position import TursoPosition
    >>> a, b = TursoPosition(7), TursoPosition.from_doc({"change_id": 9})
    >>> a.order < b.order, b.to_doc()
    (True, {'change_id': 9})
"""

from __future__ import annotations

from typing import Protocol, TypeAlias, Union

JsonValue: TypeAlias = Union[str, int, float, bool, list["JsonValue"], dict[str, "JsonValue"], None]  # noqa: UP007
PositionDoc: TypeAlias = dict[str, JsonValue]
"""A position as stored: a JSON mapping (what the checkpoint store and the CLI see)."""


class Position(Protocol):
    """What the pipeline needs from any source's position type."""

    @property
    def order(self) -> tuple[int, ...]:
        """Sorts in source order: a sink at ``a`` has every change at or before ``a``."""
        ...

    def to_doc(self) -> PositionDoc:
        """The stored form."""
        ...


def as_int(doc: PositionDoc, key: str, default: int = 0) -> int:
    """An integer field of a stored position (``default`` when an older version left it out)."""
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"checkpoint field {key!r} is not an integer: {value!r}")
    return int(value)


def as_str(doc: PositionDoc, key: str, default: str = "") -> str:
    """A text field of a stored position (``default`` when missing or null)."""
    value = doc.get(key, default)
    return default if value is None else str(value)
