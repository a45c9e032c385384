"""MySQL character sets as Python codecs, for the string values python-mysql-replication decodes
(in the decoder process).

The library decodes a CHAR, VARCHAR or TEXT value with the codec named like the column's
character set (PyMySQL's ``Charset.encoding``), which is wrong for several of MySQL's:

* ``utf16``, ``utf32`` and ``ucs2`` are big-endian in MySQL; Python's ``utf16`` and ``utf32``
  read little-endian without a byte-order mark, so a utf32 value failed the whole stream
  (``UnicodeDecodeError``) and a utf16 one became other characters; ``ucs2`` and ``utf16le``
  name no Python codec, so their values came out as bytes;
* ``latin1`` is MySQL's Windows-1252, whose five unassigned bytes (0x81, 0x8D, 0x8F, 0x90,
  0x9D) MySQL maps to the control characters of the same number; Python's ``cp1252`` refuses
  them, and they are common in latin1 columns that hold UTF-8 bytes (``Á`` is ``C3 81``): the
  stream stopped there.

A snapshot reads every one of them right (the server converts to the connection's utf8mb4).
:func:`install` gives the library this module's names instead. A character set Python has no
codec for at all (armscii8, swe7, keybcs2, dec8, hp8, geostd8, macce, eucjpms) still comes out
as its bytes.
"""

from __future__ import annotations

import codecs
import functools
from typing import Any

_LATIN1 = "deltaforge_mysql_latin1"
# By the name the library gives a column's character set (its ``Charset.encoding``): MySQL's name,
# but "utf8" for utf8mb4 and utf8mb3, and "cp1252" for latin1 (MySQL has no cp1252 of its own).
_NAMES = {
    "utf8": "utf-8", "cp1252": _LATIN1,
    "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be", "ucs2": "utf-16-be",
}  # fmt: skip

# MySQL's latin1: cp1252, with its five unassigned bytes as the control characters they number.
_LATIN1_TABLE = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(256))


def _latin1(data: Any, errors: str = "strict", /) -> tuple[str, int]:
    return codecs.charmap_decode(data, errors, _LATIN1_TABLE)


def _find(name: str) -> codecs.CodecInfo | None:
    if name != _LATIN1:
        return None
    latin1 = codecs.lookup("latin-1")  # encoding is never asked for: only its decode is used
    return codecs.CodecInfo(latin1.encode, _latin1, name=_LATIN1)


codecs.register(_find)  # at import: every user of encoding() can decode with what it names


@functools.cache
def encoding(charset: str) -> str:
    """The Python codec for a column's character set, as the library names it (the name as it
    is where Python has no other)."""
    return _NAMES.get(charset, charset)


def install() -> None:
    """Make python-mysql-replication decode strings with :func:`encoding` in this process."""
    from pymysqlreplication.row_event import RowsEvent

    RowsEvent.charset_to_encoding = staticmethod(encoding)
