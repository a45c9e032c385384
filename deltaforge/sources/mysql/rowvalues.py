"""What python-mysql-replication's rows need before they are events: their primary key from the
table map's metadata, the values it decodes wrongly (empty VARBINARY as text, TIMESTAMP
without its zone), and the values a partial row image leaves out (it gives them as None).
Runs in the decoder process, per rows event."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from deltaforge.sources.mysql.tablemaps import KEY_ORDER

TIMESTAMP_TYPES = {7, 17}  # TIMESTAMP, TIMESTAMP2: an instant, stored as UTC seconds


_SIZES = ("max_length", "precision", "decimals", "fsp", "size", "length_size", "bits")


def sized(column: Any) -> str:
    """A table map column's length, precision and scale, fractional seconds and sign, as one
    string: what tells ``decimal(5,2)`` from ``decimal(5,1)`` or ``varchar(20)`` from
    ``varchar(10)``, which share a type code (a change between them converts rows without a row
    event)."""
    sizes = ",".join(str(getattr(column, a, "")) for a in _SIZES)
    return f"{sizes} unsigned" if getattr(column, "unsigned", False) else sizes


def primary_key(ev: Any) -> tuple[str, ...]:
    """A rows event's primary-key columns in the key's order, from its table map's metadata
    (binlog_row_metadata=FULL, :data:`tablemaps.KEY_ORDER`); in column order where the table map
    was not one of ours."""
    table = (getattr(ev, "table_map", None) or {}).get(ev.table_id)
    order: tuple[str, ...] | None = getattr(table, KEY_ORDER, None)
    if order is not None:
        return order
    return tuple(c.name for c in ev.columns if getattr(c, "is_primary", False))


STRING_TYPES = {15, 253, 254}  # VARCHAR, VAR_STRING, STRING (BINARY/VARBINARY with charset binary)
BYTES_TYPES = STRING_TYPES | {252}  # and BLOB (every BLOB and TEXT size): bytes with charset binary


def as_bytes(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """BINARY/VARBINARY/BLOB values as bytes. python-mysql-replication "decodes" them with the
    codec named "binary", which fails and keeps the bytes, except for an empty value: Python
    decodes b"" to "" without looking the codec up, so an empty VARBINARY or BLOB came out as
    text (a snapshot reads it as bytes)."""
    for row in rows:
        for image in (row.get("values"), row.get("before_values"), row.get("after_values")):
            if image is not None:
                for name in columns:
                    value = image.get(name)
                    if isinstance(value, str):
                        image[name] = value.encode("latin-1")


def as_utc(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """TIMESTAMP values as aware UTC datetimes. python-mysql-replication returns them naive (in
    UTC), which would make them indistinguishable from DATETIME, a wall-clock time without a zone."""
    for row in rows:
        for image in (row.get("values"), row.get("before_values"), row.get("after_values")):
            if image is not None:
                for name in columns:
                    value = image.get(name)
                    if value is not None:
                        image[name] = value.replace(tzinfo=UTC)


NOT_LOGGED = "__not_logged__"
"""The key of the marker ``{"__not_logged__": True}``: a value the row image does not carry."""


def _absent(ev: Any, bitmap: bytes) -> list[int]:
    """The columns a row image's columns-present bitmap leaves out."""
    return [i for i in range(len(ev.columns)) if not bitmap[i >> 3] & (1 << (i & 7))]


def fill_not_logged(ev: Any, op: str) -> list[str]:
    """Mark what a partial row image leaves out, and name it ([] for a full image, as with
    ``binlog_row_image=FULL``). A session may set ``binlog_row_image`` to MINIMAL or NOBLOB for
    itself, whatever the server's: its updates then log only the key before and the changed
    columns after, and python-mysql-replication gives every left-out column as None, a false
    NULL. An update's after image takes a left-out column from its before image when that has
    it (not in the after image means unchanged); anything else becomes ``{"__not_logged__":
    True}``, as the PostgreSQL source marks an unchanged TOAST value."""
    if op == "u":
        before, after = _absent(ev, ev.columns_present_bitmap), _absent(ev, ev.columns_present_bitmap2)
        if not before and not after:
            return []
        names = [c.name for c in ev.columns]
        for row in ev.rows:
            old, new = row["before_values"], row["after_values"]
            for i in after:
                new[names[i]] = old[names[i]] if i not in before else {NOT_LOGGED: True}
            for i in before:
                old[names[i]] = {NOT_LOGGED: True}
        return sorted({names[i] for i in before})  # the after image is marked only where the before is
    missing = _absent(ev, ev.columns_present_bitmap)
    if not missing:
        return []
    names = [ev.columns[i].name for i in missing]
    for row in ev.rows:
        image = row["values"]
        for name in names:
            image[name] = {NOT_LOGGED: True}
    return names
