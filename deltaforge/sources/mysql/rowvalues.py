"""What python-mysql-replication's rows need before they are events: their primary key from the
table map's metadata, the values it decodes wrongly (empty VARBINARY as text, TIMESTAMP
without its zone), and the values a partial row image leaves out (it gives them as None).
Runs in the decoder process, per rows event."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from deltaforge.sources.mysql.mariadbtypes import AS_TEXT

KEY_ORDER = "_deltaforge_key"
NAMED = "_deltaforge_named"
"""Set on a table map's ``Table`` by ``tablemaps``: whether its optional metadata named the columns."""
"""The attribute of the library's ``Table`` (what a rows event finds in its ``table_map``) that
holds the table's primary-key columns in the key's own order. The library keeps only which columns
are in the key (``is_primary``, in column order); the table map lists them in key order, the order
of a snapshot's key (the catalogue's) and of Debezium's. Underscored: out of ``Table.data``."""

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
    (binlog_row_metadata=FULL; :data:`KEY_ORDER`, set by ``tablemaps``), or in column order where
    the table map was not one of ours."""
    table = (getattr(ev, "table_map", None) or {}).get(ev.table_id)
    order: tuple[str, ...] | None = getattr(table, KEY_ORDER, None)
    if order is not None:
        return order
    return tuple(c.name for c in ev.columns if getattr(c, "is_primary", False))


UNNAMED = (
    "carries no column names (binlog_row_metadata is not FULL: switched after the pipeline started, or "
    "when this binlog was written), so its rows can be told neither by column nor by key; set "
    "binlog_row_metadata=FULL and re-snapshot the table from a position after it"
)


def columns_named(ev: Any) -> bool:
    """Whether a rows event's table map named its columns (binlog_row_metadata=FULL). Without the
    names python-mysql-replication calls them ``UNKNOWN_COL0``…, and without the primary key's
    list the rows have no key. True where the table map was not one of ours."""
    table = (getattr(ev, "table_map", None) or {}).get(ev.table_id)
    return bool(getattr(table, NAMED, True))


STRING_TYPES = {15, 253, 254}  # VARCHAR, VAR_STRING, STRING (BINARY/VARBINARY with charset binary)
BYTES_TYPES = STRING_TYPES | {252}  # and BLOB (every BLOB and TEXT size): bytes with charset binary


def as_bytes(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """BINARY/VARBINARY/BLOB values as bytes. python-mysql-replication "decodes" them with the
    codec named "binary", which fails and keeps the bytes, except for an empty value: Python
    decodes b"" to "" without looking the codec up, so an empty VARBINARY or BLOB came out as
    text (a snapshot reads it as bytes)."""
    for row in rows:
        for image, _ in _images(row):
            if image is not None:
                for name in columns:
                    value = image.get(name)
                    if isinstance(value, str):
                        image[name] = value.encode("latin-1")


_ZERO_TIMESTAMP = datetime(1970, 1, 1)
"""A TIMESTAMP stored as 0: MySQL's zero date (the type's range starts a second later)."""


def as_utc(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """TIMESTAMP values as aware UTC datetimes. python-mysql-replication returns them naive (in
    UTC), which would make them indistinguishable from DATETIME, a wall-clock time without a zone.
    The zero TIMESTAMP (``0000-00-00 00:00:00``), which the library reads as the epoch, is None, as
    it gives a zero DATE or DATETIME, and as a snapshot reads any of them (README, MySQL / MariaDB)."""
    for row in rows:
        for image, _ in _images(row):
            if image is not None:
                for name in columns:
                    value = image.get(name)
                    if isinstance(value, datetime):
                        image[name] = None if value == _ZERO_TIMESTAMP else value.replace(tzinfo=UTC)


_F32 = struct.Struct("<f")


def short_float(value: float) -> float:
    """A FLOAT's value as the shortest decimal that reads back as the same 32-bit float: ``1.1``,
    not the double it widens to, ``1.100000023841858``. Lossless, and what a snapshot of the row
    gives (``snapshot.py`` reads FLOAT columns widened, exactly, and shortens them the same way)."""
    packed = _F32.pack(value)
    for digits in range(1, 9):  # nine always read back
        shorter = float(f"{value:.{digits}g}")
        try:
            if _F32.pack(shorter) == packed:
                return shorter
        except OverflowError:  # rounded past the largest float
            continue
    return float(f"{value:.9g}")


class Retyped:
    """A table's values python-mysql-replication gives otherwise than a snapshot reads them, and
    so otherwise than a change of the row carries them, set right in a rows event's images:

    * FLOAT: the widened double (``1.100000023841858``), now its :func:`short_float`;
    * SET: a Python set (which sinks wrote as a sorted JSON list), and None for the empty set, a
      false NULL. Now MySQL's text: the members in the column's order, joined by commas, ``""``
      for none (the library says which None was an empty set);
    * BINARY(n): the binlog drops a value's trailing zero bytes (the type's padding), so
      ``x'ff000000'`` came out as ``b'\xff'``. Now padded back to n bytes;
    * BIT(n): a string of ``0`` and ``1``; now the bytes the server gives (``b'101'``: ``b'\x05'``);
    * YEAR: the year 0000 (what an invalid year becomes) came out as 1900; now 0;
    * TIME(n) below zero with a fraction: MySQL stores it as one two's complement of the whole
      value, fraction included, and the library takes the complement of the seconds alone:
      ``-00:00:01.25`` came out as ``-00:00:01.75`` (its whole seconds are right, its fraction is
      the complement's). Now the fraction is the stored one: ``1 - f``;
    * MariaDB's UUID, INET4 and INET6 (``texts``: the columns the catalogue says are of them,
      which the table map gives as BINARY(n)): their stored bytes; now their text
      (``mariadbtypes``).

    Built per table schema (the decoder's); ``bool`` says whether there is anything to do."""

    def __init__(self, columns: list[Any], texts: Mapping[str, str] | None = None) -> None:
        texts = texts or {}
        self.floats = tuple(c.name for c in columns if c.type == _FLOAT)
        self.sets = tuple((c.name, tuple(c.set_values or ())) for c in columns if c.type == _SET)
        # UUID, INET4 and INET6 columns too: padded first, their text is of all their bytes
        self.padded = tuple(
            (c.name, int(c.max_length)) for c in columns
            if c.type == _STRING and getattr(c, "character_set_name", None) == "binary"
        )  # fmt: skip
        self.bits = tuple((c.name, int(c.bytes)) for c in columns if c.type == _BIT)
        self.years = tuple(c.name for c in columns if c.type == _YEAR)
        self.times = tuple(c.name for c in columns if c.type == _TIME2 and getattr(c, "fsp", 0))
        self.texts = tuple((name, AS_TEXT[kind]) for name, kind in texts.items())

    def __bool__(self) -> bool:
        return bool(
            self.floats or self.sets or self.padded or self.bits or self.years or self.times or self.texts
        )

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        floats, sets, padded, bits, years = self.floats, self.sets, self.padded, self.bits, self.years
        times, texts = self.times, self.texts
        for row in rows:
            for image, nones in _images(row):
                if image is None:
                    continue
                for name in floats:
                    value = image.get(name)
                    if isinstance(value, float):
                        image[name] = short_float(value)
                for name, members in sets:
                    value = image.get(name)
                    if isinstance(value, set):
                        image[name] = ",".join(m for m in members if m in value)
                    elif value is None and nones and nones.get(name) == _EMPTY_SET:
                        image[name] = ""
                for name, size in padded:
                    value = image.get(name)
                    if isinstance(value, bytes) and len(value) < size:
                        image[name] = value.ljust(size, b"\x00")
                for name, size in bits:
                    value = image.get(name)
                    if isinstance(value, str):
                        image[name] = int(value, 2).to_bytes(size, "big")
                for name in years:
                    if image.get(name) == 1900:  # stored as 0 (1901-2155 are 1-255)
                        image[name] = 0
                for name in times:
                    value = image.get(name)
                    if isinstance(value, timedelta) and value.days < 0 and value.microseconds:
                        image[name] = timedelta(value.days, value.seconds, 1_000_000 - value.microseconds)
                for name, text in texts:
                    value = image.get(name)
                    if isinstance(value, bytes):
                        image[name] = text(value)


_FLOAT, _YEAR, _TIME2, _BIT, _SET, _STRING = 4, 13, 19, 16, 248, 254  # pymysqlreplication FIELD_TYPE codes
_EMPTY_SET = "empty set"  # pymysqlreplication.constants.NONE_SOURCE.EMPTY_SET


def _images(row: dict[str, Any]) -> tuple[tuple[Any, Any], ...]:
    """A row's images with what the library says of their None values."""
    return (
        (row.get("values"), row.get("none_sources")),
        (row.get("before_values"), row.get("before_none_sources")),
        (row.get("after_values"), row.get("after_none_sources")),
    )


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
