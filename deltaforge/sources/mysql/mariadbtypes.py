"""MariaDB's own data types that the binlog does not name: ``UUID``, ``INET4`` and ``INET6``.

A table map gives their columns as ``BINARY(16)``, ``BINARY(4)`` and ``BINARY(16)`` (type code
254, the binary character set): python-mysql-replication hands on their stored bytes, while a
snapshot, or any client, reads their text (``'6ccd780c-baba-1026-9564-5b8c656024db'``,
``'10.0.0.1'``, ``'2001:db8::1'``). So a row's change and its snapshot would differ, and a UUID
key would key them apart. The decoder child asks the catalogue which of a table's ``BINARY(16)``
and ``BINARY(4)`` columns are of these types (once per table map it has not met, so once per
``ALTER``), and ``rowvalues.Retyped`` gives their values as the server's text, made here exactly
as the server makes it. The catalogue knows only the table as it is now: a change read from a
backlog older than an ``ALTER`` between ``BINARY(16)`` and ``UUID`` takes today's type (README).
Runs in the decoder process.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

_STRING = 254  # pymysqlreplication FIELD_TYPE.STRING: BINARY(n) with the binary character set
_SIZES = {"uuid": 16, "inet4": 4, "inet6": 16}


def uuid_text(value: bytes) -> str:
    """A UUID's text as MariaDB writes it: lower-case hex in 8-4-4-4-12. The binlog carries the
    value in the order of its text (the segment swap MariaDB may apply is the storage engine's
    record format, undone before the row is logged: ``tests/test_mysql_snapshot_values.py``)."""
    return str(uuid.UUID(bytes=value))


def inet4_text(value: bytes) -> str:
    """An INET4's dotted quad."""
    return ".".join(map(str, value))


_WORDS = struct.Struct(">8H")


def inet6_text(value: bytes) -> str:
    """An INET6's text as MariaDB's ``Inet6::to_string`` writes it, which is not quite RFC 5952
    (nor Python's ``ipaddress``): the *first* longest run of zero groups becomes ``::`` even
    when it is one group long, and an IPv4-compatible (``::1.2.3.4``, the first six groups zero)
    or IPv4-mapped (``::ffff:1.2.3.4``) address ends in its dotted quad."""
    words = _WORDS.unpack(value)
    gap, length, i = -1, 0, 0
    while i < 8:
        if words[i]:
            i += 1
            continue
        end = i
        while end < 8 and not words[end]:
            end += 1
        if end - i > length:
            gap, length = i, end - i
        i = end
    if gap == 0 and (length == 6 or (length == 5 and words[5] == 0xFFFF)):
        return ("::" if length == 6 else "::ffff:") + inet4_text(value[12:])
    text, i = "", 0
    while i < 8:
        if i == gap:
            text += "::" if i == 0 else ":"
            i += length
            continue
        text += f"{words[i]:x}" + (":" if i < 7 else "")
        i += 1
    return text


AS_TEXT: dict[str, Callable[[bytes], str]] = {"uuid": uuid_text, "inet4": inet4_text, "inet6": inet6_text}
"""Each type's text from its stored bytes."""


def server_types(ev: Any) -> dict[str, str]:
    """The columns of a rows event's table that are MariaDB's own UUID, INET4 or INET6, with
    their type, from the catalogue (through the reader's own catalogue connection, which the
    event carries). Asked only when the table map has a ``BINARY(16)`` or ``BINARY(4)`` column.
    A column the catalogue no longer has, or has at another size, stays bytes."""
    candidates = {
        c.name: int(c.max_length) for c in ev.columns
        if c.type == _STRING and getattr(c, "character_set_name", None) == "binary"
        and getattr(c, "max_length", None) in (4, 16)
    }  # fmt: skip
    ctl = getattr(ev, "_ctl_connection", None)
    if not candidates or ctl is None:
        return {}
    with ctl.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME AS name, LOWER(DATA_TYPE) AS type FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND DATA_TYPE IN ('uuid', 'inet4', 'inet6')",
            (ev.schema, ev.table),
        )
        found = cur.fetchall()  # the library's catalogue connection reads rows as dicts
    return {r["name"]: r["type"] for r in found if candidates.get(r["name"]) == _SIZES.get(r["type"])}
