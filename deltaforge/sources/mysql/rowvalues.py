"""What python-mysql-replication's rows need before they are events: their primary key from the
table map's metadata, and the values it decodes wrongly (empty VARBINARY as text, TIMESTAMP
without its zone). Runs in the decoder process, per rows event."""

from __future__ import annotations

from datetime import UTC
from typing import Any

TIMESTAMP_TYPES = {7, 17}  # TIMESTAMP, TIMESTAMP2: an instant, stored as UTC seconds


def primary_key(ev: Any) -> tuple[str, ...]:
    """A rows event's primary-key columns, from the table map's metadata (binlog_row_metadata=FULL)."""
    simple = tuple(c.name for c in ev.columns if getattr(c, "is_primary", False))
    if simple:
        return simple
    meta = getattr(getattr(ev, "table_obj", None), "optional_metadata", None) or getattr(
        ev, "optional_metadata", None
    )
    prefixed = getattr(meta, "primary_keys_with_prefix", None) or {}
    return tuple(ev.columns[i].name for i in sorted(prefixed) if i < len(ev.columns))


STRING_TYPES = {15, 253, 254}  # VARCHAR, VAR_STRING, STRING (BINARY/VARBINARY with charset binary)


def as_bytes(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """BINARY/VARBINARY values as bytes. python-mysql-replication "decodes" them with the codec
    named "binary", which fails and keeps the bytes, except for an empty value: Python decodes
    b"" to "" without looking the codec up, so an empty VARBINARY came out as text."""
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
