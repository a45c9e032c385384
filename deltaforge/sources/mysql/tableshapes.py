"""What the binlog decoder child knows of each captured table's shape: its columns and primary
key as the last table map gave them (what ``serve`` was told in a ``schema`` frame), and the
per-table fixes its rows need before they are sent (TIMESTAMP to UTC, binary strings as bytes,
the values python-mysql-replication gives otherwise than a snapshot). Asked once per rows event;
the work is done only when a table map is new."""

from __future__ import annotations

from typing import Any

from deltaforge.sources.mysql.halts import Undecodable
from deltaforge.sources.mysql.mariadbtypes import server_types
from deltaforge.sources.mysql.position import BinlogPosition
from deltaforge.sources.mysql.rowvalues import (
    BYTES_TYPES,
    TIMESTAMP_TYPES,
    UNNAMED,
    Retyped,
    as_bytes,
    as_utc,
    columns_named,
    primary_key,
    sized,
)

Described = tuple[tuple[tuple[str, int, str, tuple[str, ...] | None], ...], tuple[str, ...]]
"""A table's columns (name, type code, size, an ENUM's or SET's members) and primary-key columns,
as a table map gives them."""


def members(column: Any) -> tuple[str, ...] | None:
    """An ENUM's or SET's members, as the table map lists them (binlog_row_metadata=FULL): a
    member taken out of the list converts the rows that held it, and nothing else tells (the
    type code and sizes stay)."""
    listed = column.enum_values or column.set_values
    return tuple(listed) if listed else None


class TableShapes:
    """Each captured table's shape and the fixes its rows need, kept by table name."""

    def __init__(self, is_mariadb: bool) -> None:
        self._is_mariadb = is_mariadb
        # by the table map's column list; with the columns the catalogue says are MariaDB's UUID, INET4, INET6
        self._described: dict[str, tuple[list[Any], Described, dict[str, str]]] = {}
        self._schemas: dict[str, Described] = {}  # as the last schema frame told serve
        self._instants: dict[str, tuple[str, ...]] = {}  # a table's TIMESTAMP columns
        self._binaries: dict[str, tuple[str, ...]] = {}  # a table's BINARY/VARBINARY columns
        self._retyped: dict[str, Retyped | None] = {}  # values the library gives otherwise than a snapshot

    def schema_frame(self, ev: Any, table: str, file: str, pos: int, gtid: str) -> tuple[Any, ...] | None:
        """The ``schema`` frame ``serve`` needs before this rows event's rows, when the table's
        columns or primary key differ from what it was last told; else None. A new primary key
        is a new schema too, its columns unchanged or not: each change's key columns (the Kafka
        record key, a target's conflict key) are the ones it was written with.

        Raises :class:`Undecodable` when the table map names no columns. The frame's last item
        is the primary key."""
        known = self._described.get(table)
        if known is None or known[0] is not ev.columns:  # a new table map (the list is its own)
            if not columns_named(ev):
                raise Undecodable(f"the table map of {table} at {file}:{pos} {UNNAMED}")
            texts = server_types(ev) if self._is_mariadb else {}  # UUID, INET4, INET6
            columns = tuple(
                (c.name, c.type, f"{sized(c)} {texts[c.name]}" if c.name in texts else sized(c), members(c))
                for c in ev.columns
            )
            known = self._described[table] = (ev.columns, (columns, primary_key(ev)), texts)
        if self._schemas.get(table) == known[1]:
            return None
        self._schemas[table] = known[1]
        columns, pk = known[1]
        self._instants[table] = tuple(n for n, t, _, _ in columns if t in TIMESTAMP_TYPES)
        self._binaries[table] = tuple(
            c.name for c in ev.columns
            if c.type in BYTES_TYPES and getattr(c, "character_set_name", None) == "binary"
        )  # fmt: skip
        self._retyped[table] = Retyped(ev.columns, known[2]) or None  # None: nothing to set right
        cols = [
            {"name": n, "type": t, "mod": m, "key": n in pk} | ({"members": list(e)} if e else {})
            for n, t, m, e in columns
        ]
        return ("schema", table, cols, BinlogPosition(file, pos, 0, gtid).to_doc(), pk)

    def fix(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Set right, in place, the values of ``table``'s rows the library decodes otherwise
        than a snapshot reads them."""
        if instants := self._instants[table]:
            as_utc(rows, instants)
        if binaries := self._binaries[table]:
            as_bytes(rows, binaries)  # before the padding of BINARY(n) (retyped)
        if (fix := self._retyped[table]) is not None:
            fix(rows)
