"""A decoder for PostgreSQL's ``pgoutput`` logical replication protocol (version 1).

Message formats: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
Each function takes the raw bytes of one message; anything truncated or unknown
raises :class:`DecodeError` naming the LSN, never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deltaforge.slots import slot_constructor

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")

UNCHANGED_TOAST = object()
"""Marks a column whose TOASTed value did not change (pgoutput sends no value for it)."""


class DecodeError(ValueError):
    """A pgoutput message that cannot be decoded."""

    def __init__(self, lsn: int, detail: str) -> None:
        super().__init__(f"cannot decode pgoutput message at LSN {format_lsn(lsn)}: {detail}")
        self.lsn = lsn


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    key: bool
    type_mod: int = -1
    """``atttypmod``: a length, or a precision and scale (``numeric(5,2)``); -1 for none."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """Insert (``c``), update (``u``) or delete (``d``); tuples are lists of raw text values."""

    op: str
    relid: int
    old: list[Any] | None
    new: list[Any] | None
    key_only: bool = False
    """``old`` is the replica identity's key (a ``K`` tuple): its other columns are sent as null,
    not because they are."""


@dataclass(frozen=True, slots=True)
class Truncate:
    relids: tuple[int, ...]
    options: int


@dataclass(frozen=True, slots=True)
class Other:
    """Origin and Type messages: decoded, carry nothing a CDC event needs."""

    kind: str


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """``pg_logical_emit_message``: snapshot watermarks are written as these."""

    transactional: bool
    prefix: str
    content: bytes


new_change: Callable[[str, int, list[Any] | None, list[Any] | None, bool], Change] = slot_constructor(Change)
"""``Change(...)``, every field given: one per row decoded, without the frozen ``__init__`` (0.61
against 0.15 µs a change; docs/performance.md)."""

Message = Begin | Commit | Relation | Change | Truncate | Other | LogicalMessage


class _Reader:
    __slots__ = ("buf", "lsn", "pos")

    def __init__(self, buf: bytes, lsn: int) -> None:
        self.buf = buf
        self.pos = 1
        self.lsn = lsn

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise DecodeError(self.lsn, f"truncated at byte {self.pos} of {len(self.buf)} (wanted {n} more)")

    def u8(self) -> int:
        self.need(1)
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def i16(self) -> int:
        self.need(2)
        v = int(_I16.unpack_from(self.buf, self.pos)[0])
        self.pos += 2
        return v

    def i32(self) -> int:
        self.need(4)
        v = int(_I32.unpack_from(self.buf, self.pos)[0])
        self.pos += 4
        return v

    def u32(self) -> int:
        self.need(4)
        v = int(_U32.unpack_from(self.buf, self.pos)[0])
        self.pos += 4
        return v

    def i64(self) -> int:
        self.need(8)
        v = int(_I64.unpack_from(self.buf, self.pos)[0])
        self.pos += 8
        return v

    def u64(self) -> int:
        self.need(8)
        v = int(_U64.unpack_from(self.buf, self.pos)[0])
        self.pos += 8
        return v

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError(self.lsn, f"unterminated string at byte {self.pos}")
        raw = self.buf[self.pos : end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(self.lsn, f"invalid UTF-8 in string at byte {self.pos}") from exc

    def tuple_data(self) -> list[Any]:
        out, self.pos = tuple_data(self.buf, self.pos, self.lsn)
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise DecodeError(self.lsn, f"{len(self.buf) - self.pos} unexpected trailing bytes")


def tuple_data(buf: bytes, pos: int, lsn: int) -> tuple[list[Any], int]:
    """A TupleData at ``pos``: the values and the position after them.

    The hot path of decoding (once per column of every row), so it works on
    locals instead of reader methods.
    """
    end = len(buf)
    if pos + 2 > end:
        raise DecodeError(lsn, f"truncated at byte {pos} of {end} (wanted 2 more)")
    n = int(_I16.unpack_from(buf, pos)[0])
    if n < 0:
        raise DecodeError(lsn, f"negative column count {n}")
    pos += 2
    out: list[Any] = []
    append = out.append
    unpack = _I32.unpack_from
    for _ in range(n):
        if pos >= end:
            raise DecodeError(lsn, f"truncated at byte {pos} of {end} (wanted 1 more)")
        kind = buf[pos]
        pos += 1
        if kind == 0x74 or kind == 0x62:  # 't' text, 'b' binary
            if pos + 4 > end:
                raise DecodeError(lsn, f"truncated at byte {pos} of {end} (wanted 4 more)")
            size = unpack(buf, pos)[0]
            pos += 4
            stop = pos + size
            if size < 0 or stop > end:
                raise DecodeError(lsn, f"value of {size} bytes at byte {pos} overruns the message of {end}")
            if kind == 0x74:
                try:
                    append(buf[pos:stop].decode())
                except UnicodeDecodeError as exc:
                    raise DecodeError(lsn, "invalid UTF-8 in a text value") from exc
            else:
                append(bytes(buf[pos:stop]))
            pos = stop
        elif kind == 0x6E:  # 'n'
            append(None)
        elif kind == 0x75:  # 'u'
            append(UNCHANGED_TOAST)
        else:
            raise DecodeError(lsn, f"unknown tuple value kind {kind!r}")
    return out, pos


def decode(buf: bytes, lsn: int = 0) -> Message:
    """One pgoutput message."""
    if not buf:
        raise DecodeError(lsn, "empty message")
    r = _Reader(buf, lsn)
    tag = buf[0]
    msg: Message
    if tag == 0x42:  # B
        msg = Begin(r.u64(), r.i64(), r.u32())
    elif tag == 0x43:  # C
        r.u8()
        msg = Commit(r.u64(), r.u64(), r.i64())
    elif tag == 0x52:  # R
        relid = r.u32()
        ns, name = r.string(), r.string()
        ident = chr(r.u8())
        ncols = r.i16()
        if ncols < 0:
            raise DecodeError(lsn, f"negative column count {ncols}")
        cols = []
        for _ in range(ncols):
            flags = r.u8()
            cname = r.string()
            oid = r.u32()
            cols.append(Column(cname, oid, bool(flags & 1), r.i32()))
        msg = Relation(relid, ns, name, ident, tuple(cols))
    elif tag == 0x49:  # I  (the most common message: decoded without the reader)
        if len(buf) < 6 or buf[5] != 0x4E:
            raise DecodeError(lsn, "insert without a new tuple")
        values, end = tuple_data(buf, 6, lsn)
        if end != len(buf):
            raise DecodeError(lsn, f"{len(buf) - end} unexpected trailing bytes")
        return new_change("c", int(_U32.unpack_from(buf, 1)[0]), None, values, False)
    elif tag == 0x55:  # U
        relid = r.u32()
        kind = r.u8()
        old, key_only = None, kind == 0x4B
        if kind in (0x4B, 0x4F):  # K, O
            old = r.tuple_data()
            kind = r.u8()
        if kind != 0x4E:
            raise DecodeError(lsn, "update without a new tuple")
        msg = new_change("u", relid, old, r.tuple_data(), key_only)
    elif tag == 0x44:  # D
        relid = r.u32()
        kind = r.u8()
        if kind not in (0x4B, 0x4F):
            raise DecodeError(lsn, "delete without a key or old tuple")
        msg = new_change("d", relid, r.tuple_data(), None, kind == 0x4B)
    elif tag == 0x54:  # T
        n = r.i32()
        if n < 0 or n > len(buf):
            raise DecodeError(lsn, f"bad relation count {n}")
        options = r.u8()
        msg = Truncate(tuple(r.u32() for _ in range(n)), options)
    elif tag == 0x4F:  # O origin
        r.u64()
        r.string()
        msg = Other("origin")
    elif tag == 0x59:  # Y type
        r.u32()
        r.string()
        r.string()
        msg = Other("type")
    elif tag == 0x4D:  # M logical message
        flags = r.u8()
        r.u64()
        prefix = r.string()
        size = r.i32()
        if size < 0:
            raise DecodeError(lsn, f"negative message length {size}")
        r.need(size)
        content = bytes(r.buf[r.pos : r.pos + size])
        r.pos += size
        msg = LogicalMessage(bool(flags & 1), prefix, content)
    else:
        raise DecodeError(lsn, f"unknown message type {chr(tag)!r}")
    r.done()
    return msg
