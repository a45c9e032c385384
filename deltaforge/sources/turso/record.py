"""Decoder for SQLite's record format (the before/after blobs in ``turso_cdc``).

Turso's own ``bin_record_json_object`` refuses BLOB columns, so records are
decoded here: a varint header length, one serial type per column, then values.
See https://www.sqlite.org/fileformat.html#record_format.
"""

from __future__ import annotations

import math
import struct
from typing import Any

_INT_SIZES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8}
_F64 = struct.Struct(">d")
INFINITIES = {math.inf: "Infinity", -math.inf: "-Infinity"}
"""A REAL SQLite stores as an infinity (its NaN is NULL), as text: JSON has no number for it, and
orjson writes it as null, a false NULL (as the PostgreSQL source's, README)."""


class RecordError(ValueError):
    """A blob that is not a valid SQLite record."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        if pos >= len(buf):
            raise RecordError("truncated varint")
        byte = buf[pos]
        pos += 1
        if i == 8:
            return (value << 8) | byte, pos
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, pos
    raise RecordError("unreachable")  # pragma: no cover


def decode_record(buf: bytes) -> list[Any]:
    """The column values of one record, in column order."""
    header_len, pos = _varint(buf, 0)
    if header_len > len(buf):
        raise RecordError(f"header length {header_len} beyond record of {len(buf)} bytes")
    types: list[int] = []
    while pos < header_len:
        t, pos = _varint(buf, pos)
        types.append(t)
    data = header_len
    out: list[Any] = []
    for t in types:
        if t == 0:
            out.append(None)
        elif t in _INT_SIZES:
            n = _INT_SIZES[t]
            out.append(int.from_bytes(buf[data : data + n], "big", signed=True))
            data += n
        elif t == 7:
            value = _F64.unpack_from(buf, data)[0]
            out.append(INFINITIES.get(value, value))
            data += 8
        elif t == 8:
            out.append(0)
        elif t == 9:
            out.append(1)
        elif t >= 12:
            n = (t - 12) // 2
            chunk = buf[data : data + n]
            if len(chunk) != n:
                raise RecordError("truncated value")
            out.append(_text(chunk) if t & 1 else bytes(chunk))
            data += n
        else:
            raise RecordError(f"reserved serial type {t}")
    if data > len(buf):
        raise RecordError("truncated record")
    return out


def _text(chunk: bytes) -> str | bytes:
    """A TEXT value; one that is not valid UTF-8 (SQLite does not check) stays bytes, unaltered."""
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(chunk)


def table_info(create_sql: str, table: str) -> list[Any]:
    """``PRAGMA table_info`` of a table as ``create_sql`` defines it (built in a scratch database)."""
    import turso

    scratch = turso.connect(":memory:")
    try:
        scratch.execute(create_sql)
        return list(scratch.execute(f"PRAGMA table_info({quote_name(table)})").fetchall())
    finally:
        scratch.close()


def quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
