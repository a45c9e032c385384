"""Rows events decoded by a reader compiled for their table (the decoder child's).

python-mysql-replication decodes every value of every row through one general routine: a
chain of type tests, a bitmap lookup and a buffered ``read`` per value, about four fifths of the
decoder child's time on a backlog (docs/performance.md). A table's columns are known from its
table map, so :func:`rows_of` generates, once per distinct column list, Python code that
reads one full row image straight from the event's bytes: fixed offsets, ``struct`` readers
bound in advance, strings decoded with their charset's codec.

Only what it has been proven equal to the library on is compiled (``tests/test_mysql_row_images.py``):
the integer types, FLOAT, DOUBLE, DECIMAL, CHAR/VARCHAR/BINARY/VARBINARY, TEXT/BLOB, ENUM, DATE,
DATETIME, TIMESTAMP and YEAR with fractional seconds, in full row images (``binlog_row_image=FULL``).
Anything else — another column type (JSON, BIT, SET, TIME, GEOMETRY), a partial row image, a
table map without column names, a charset Python has no codec for — is decoded by the library,
as before.
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import RowsEvent

Reader = Callable[[bytes, int, int], list[dict[str, Any]]]
"""Reads the rows from ``pos`` to ``end`` of an event's bytes."""

LIMIT = 1024
"""Distinct column lists whose readers are kept (each ALTER makes a new one)."""

_FIXED = {  # type code: (struct format signed, unsigned, size)
    FIELD_TYPE.TINY: ("<b", "<B", 1),
    FIELD_TYPE.SHORT: ("<h", "<H", 2),
    FIELD_TYPE.LONG: ("<i", "<I", 4),
    FIELD_TYPE.LONGLONG: ("<q", "<Q", 8),
    FIELD_TYPE.FLOAT: ("<f", "<f", 4),
    FIELD_TYPE.DOUBLE: ("<d", "<d", 8),
}
_FSP_BYTES = (0, 1, 1, 2, 2, 3, 3)
_SCALE = (1_000_000, 100_000, 10_000, 1_000, 100, 10, 1)  # 10 ** (6 - fsp)
_DIGITS = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a DECIMAL's leftover digits


def _fsp(buf: bytes, pos: int, fsp: int) -> int:
    """Fractional seconds as microseconds, as the library reads them (big-endian, signed)."""
    size = _FSP_BYTES[fsp]
    if not size:
        return 0
    micro = int.from_bytes(buf[pos : pos + size], "big", signed=True)
    if fsp % 2:
        micro = int(micro / 10)
    return micro * _SCALE[fsp]


def _datetime2(buf: bytes, pos: int, fsp: int) -> datetime.datetime | None:
    data = int.from_bytes(buf[pos : pos + 5], "big")
    year_month = (data >> 22) & 0x1FFFF
    try:
        value = datetime.datetime(
            year=int(year_month / 13),
            month=year_month % 13,
            day=(data >> 17) & 0x1F,
            hour=(data >> 12) & 0x1F,
            minute=(data >> 6) & 0x3F,
            second=data & 0x3F,
        )
    except ValueError:  # a zero date: the library gives None
        return None
    micro = _fsp(buf, pos + 5, fsp)
    return value.replace(microsecond=micro) if micro > 0 else value


def _timestamp2(buf: bytes, pos: int, fsp: int) -> datetime.datetime:
    seconds = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
    value = datetime.datetime.utcfromtimestamp(seconds)  # naive UTC, as the library's (as_utc adds the zone)
    micro = _fsp(buf, pos + 4, fsp)
    return value.replace(microsecond=micro) if micro > 0 else value


def _date(buf: bytes, pos: int) -> datetime.date | None:
    value = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
    year, month, day = (value >> 9) & 0x7FFF, (value >> 5) & 0xF, value & 0x1F
    if not (year and month and day):  # 0000-00-00 and its kin: the library gives None
        return None
    try:
        return datetime.date(year, month, day)
    except ValueError:  # 2024-02-30, stored under ALLOW_INVALID_DATES: None (see install)
        return None


def _calendar_or_none(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def read_or_none(self: Any) -> Any:
        try:
            return read(self)
        except ValueError:  # raised building the value, after its bytes were read
            return None

    return read_or_none


def install() -> None:
    """Make the library's own DATE and DATETIME (the old format's) readers give None for a date
    no calendar has, as for a zero date. A server lets a session store ``2024-02-30`` (sql_mode
    ALLOW_INVALID_DATES); the library raised ``ValueError`` on it, which stopped the stream at
    that row for good (a snapshot reads it as null, README)."""
    for name in ("_RowsEvent__read_date", "_RowsEvent__read_datetime"):
        read = getattr(RowsEvent, name)
        if not getattr(read, "calendar_or_none", False):
            lenient = _calendar_or_none(read)
            lenient.calendar_or_none = True  # type: ignore[attr-defined]
            setattr(RowsEvent, name, lenient)


def _decimal_size(precision: int, decimals: int) -> int:
    integral = precision - decimals
    return (integral // 9 + decimals // 9) * 4 + _DIGITS[integral % 9] + _DIGITS[decimals % 9]


def _decimal(buf: bytes, pos: int, precision: int, decimals: int) -> decimal.Decimal:
    """MySQL's packed DECIMAL, digit groups as the library joins them (the sign in the first
    byte's high bit; a negative number's bytes inverted)."""
    integral = precision - decimals
    data = bytearray(buf[pos : pos + _decimal_size(precision, decimals)])
    mask, text = (0, "") if data[0] & 0x80 else (-1, "-")
    data[0] ^= 0x80
    at = 0

    def group(size: int) -> int:
        nonlocal at
        value = int.from_bytes(data[at : at + size], "big", signed=True) ^ mask
        at += size
        return value

    if size := _DIGITS[integral % 9]:
        text += str(group(size))
    for _ in range(integral // 9):
        text += f"{group(4):09d}"
    text += "."
    for _ in range(decimals // 9):
        text += f"{group(4):09d}"
    if size := _DIGITS[decimals % 9]:
        text += f"{group(size):0{decimals % 9}d}"
    return decimal.Decimal(text)


def _raw(value: bytes) -> bytes | str:
    """A value in a charset Python has no codec for ("binary"): the library keeps the bytes, but
    an empty value decodes to "" (Python does not look the codec up for it)."""
    return value if value else ""


def _encoding(column: Any) -> str | None:
    """The codec the library decodes ``column`` with; None if its text is left as bytes."""
    name = column.character_set_name
    encoding = "utf-8" if name is None else RowsEvent.charset_to_encoding(name)
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        return None


def _value(column: Any, target: str, env: dict[str, Any]) -> list[str] | None:
    """Lines that read ``column`` at ``pos`` into ``target`` and move ``pos`` past it; None if
    this column type is left to the library."""
    kind = column.type
    if kind in _FIXED:
        signed, unsigned, size = _FIXED[kind]
        fmt = unsigned if column.unsigned else signed
        name = f"_unpack_{fmt[1]}"  # "<b" and "<B" differ in case only: so do their names
        env[name] = struct.Struct(fmt).unpack_from
        return [f"{target} = {name}(buf, pos)[0]", f"pos += {size}"]
    if kind == FIELD_TYPE.INT24:
        return [
            f"{target} = int.from_bytes(buf[pos:pos + 3], 'little', signed={not column.unsigned})",
            "pos += 3",
        ]
    if kind == FIELD_TYPE.YEAR:
        return [f"{target} = buf[pos] + 1900", "pos += 1"]
    if kind == FIELD_TYPE.DATE:
        return [f"{target} = _date(buf, pos)", "pos += 3"]
    if kind == FIELD_TYPE.DATETIME2 and column.fsp <= 6:
        return [f"{target} = _datetime2(buf, pos, {column.fsp})", f"pos += {5 + _FSP_BYTES[column.fsp]}"]
    if kind == FIELD_TYPE.TIMESTAMP2 and column.fsp <= 6:
        return [f"{target} = _timestamp2(buf, pos, {column.fsp})", f"pos += {4 + _FSP_BYTES[column.fsp]}"]
    if kind == FIELD_TYPE.NEWDECIMAL:
        size = _decimal_size(column.precision, column.decimals)
        return [f"{target} = _decimal(buf, pos, {column.precision}, {column.decimals})", f"pos += {size}"]
    if kind == FIELD_TYPE.ENUM and column.enum_values and column.size in (1, 2):
        values = f"_enum_{len(env)}"
        env[values] = list(column.enum_values)
        return [
            f"{target} = {values}[int.from_bytes(buf[pos:pos + {column.size}], 'little')]",
            f"pos += {column.size}",
        ]
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.BLOB):
        prefix = column.length_size if kind == FIELD_TYPE.BLOB else (2 if column.max_length > 255 else 1)
        if prefix not in (1, 2, 3, 4):
            return None
        encoding = _encoding(column)
        text = f"buf[pos:pos + n].decode({encoding!r})" if encoding else "_raw(buf[pos:pos + n])"
        length = "buf[pos]" if prefix == 1 else f"int.from_bytes(buf[pos:pos + {prefix}], 'little')"
        return [f"n = {length}", f"pos += {prefix}", f"{target} = {text}", "pos += n"]
    return None


def compile_reader(columns: list[Any], images: int) -> Reader | None:
    """A reader of rows of ``images`` full row images each (2: an update's before and after),
    generated for ``columns``; None if any of them is left to the library."""
    if not columns or not all(isinstance(c.name, str) and c.name for c in columns):
        return None
    env: dict[str, Any] = {"_date": _date, "_datetime2": _datetime2, "_timestamp2": _timestamp2,
                           "_decimal": _decimal, "_raw": _raw}  # fmt: skip
    nulls = (len(columns) + 7) // 8
    body = [f"b{j} = buf[pos + {j}]" for j in range(nulls)] + [f"pos += {nulls}"]
    for i, column in enumerate(columns):
        lines = _value(column, f"v{i}", env)
        if lines is None:
            return None
        body.append(f"if b{i >> 3} & {1 << (i & 7)}:\n            v{i} = None\n        else:")
        body.extend(f"    {line}" for line in lines)
    image = ", ".join(f"{c.name!r}: v{i}" for i, c in enumerate(columns))
    steps = "\n        ".join(body)
    keys = ("values",) if images == 1 else ("before_values", "after_values")
    source = "def read(buf, pos, end):\n    rows = []\n    while pos < end:\n        row = {}\n"
    for key in keys:
        source += f"        {steps}\n        row[{key!r}] = {{{image}}}\n"
    source += "        rows.append(row)\n    return rows\n"
    # The text is built here from the table map; column names enter it only as repr() literals.
    exec(compile(source, f"<row reader: {len(columns)} columns>", "exec"), env)
    reader: Reader = env["read"]
    return reader


class RowImages:
    """The compiled readers of one decoder child, by table map column list.

    ``rows_of(ev)`` is ``ev.rows`` for any rows event: decoded by the table's compiled reader
    where there is one, by the library otherwise.
    """

    def __init__(self) -> None:
        # By the table map's column list and the number of images: the same list while the
        # table map is the same (KnownTableMap reuses a parse), so a lookup is an identity check.
        self._by_list: dict[tuple[int, int], tuple[list[Any], Reader | None, bytes]] = {}
        # By what the reader depends on: a column list parsed again finds its reader here.
        self._by_shape: dict[str, Reader | None] = {}
        self.compiled_events = 0
        self.library_events = 0

    def rows_of(self, ev: Any, images: int) -> list[dict[str, Any]]:
        columns = ev.columns
        key = (id(columns), images)
        entry = self._by_list.get(key)
        if entry is None or entry[0] is not columns:  # the list is kept: its id is not reused
            if len(self._by_list) >= LIMIT:
                self._by_list.clear()
            entry = self._by_list[key] = (columns, self._reader(columns, images), _all_present(len(columns)))
        _, reader, full = entry
        wrapper = ev.packet
        raw = wrapper.packet
        if (
            reader is None
            or ev.columns_present_bitmap != full
            or (images == 2 and ev.columns_present_bitmap2 != full)
            or ev.number_of_columns != len(columns)
            or ev._ignore_decode_errors
            or not ev.complete
            or wrapper._BinLogPacketWrapper__data_buffer
        ):
            self.library_events += 1
            rows: list[dict[str, Any]] = ev.rows
            return rows
        self.compiled_events += 1
        start = raw._position
        end = start + ev.event_size - wrapper.read_bytes
        rows = reader(raw._data, start, end)
        ev._RowsEvent__rows = rows  # ev.rows is these (the library's own parse would read on)
        return rows

    def _reader(self, columns: list[Any], images: int) -> Reader | None:
        # Every attribute of every column (enum values are lists: compared as text)
        shape = repr((images, [sorted(c.__dict__.items()) for c in columns]))
        if shape not in self._by_shape:
            if len(self._by_shape) >= LIMIT:
                self._by_shape.clear()
            self._by_shape[shape] = compile_reader(columns, images)
        return self._by_shape[shape]


def _all_present(count: int) -> bytes:
    """The columns-present bitmap of a full row image of ``count`` columns."""
    bits = (1 << count) - 1
    return bits.to_bytes((count + 7) // 8, "little")
