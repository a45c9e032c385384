"""A snapshot chunk read as one JSON document that the server builds, parsed with orjson.

aiomysql (PyMySQL's protocol, pure Python) decodes a result row by row and value by value;
that was half of a MariaDB snapshot's CPU in ``serve``. Asked for ``JSON_ARRAYAGG`` of the
chunk's rows instead, the server sends one value and orjson makes the row dicts in C: a
10,000-row chunk of a narrow table reads about three times as fast.

The rows must be the ones the plain read gives, value for value, so a column is only sent
in a form that comes back equal:

* an integer column as a JSON number (not ``ZEROFILL``: MariaDB writes ``0005`` into the
  JSON, which no parser takes);
* a column with a character set as ``CAST(… AS CHAR)``, a JSON string (a ``JSON`` column
  left as it is would arrive as an object, not as its text);
* a binary one as ``HEX(…)``, turned back into bytes;
* MariaDB's own ``UUID``, ``INET4`` and ``INET6`` as their text, a JSON string, as the plain
  read gives them;
* a decimal, float, double, date, time, datetime, timestamp or year as its text,
  ``CAST(… AS CHAR)``, given to PyMySQL's own converter for that type, as the plain read does
  (a FLOAT or DOUBLE as a JSON number would lose its type: ``38227300`` is an int).

A table with any other column type (BIT, whose ``HEX`` is a number's; spatial) is read the
plain way. So is a chunk whose document does not come back whole: the count of rows is sent
with it, and a document the server cut short (``max_allowed_packet``) or that does not parse
means the plain read, never fewer rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from pymysql.constants import FIELD_TYPE
from pymysql.converters import decoders

from deltaforge.events import Row
from deltaforge.sources.mysql.names import quote_ident

Convert = Callable[[Any], Any]

INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})
BINARY = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
TEXT_TYPES = frozenset({"uuid", "inet4", "inet6"})  # MariaDB's own: as the JSON string of their text
AS_TEXT: dict[str, Convert] = {  # PyMySQL's converter of each type's text
    "decimal": decoders[FIELD_TYPE.NEWDECIMAL],
    "date": decoders[FIELD_TYPE.DATE],
    "time": decoders[FIELD_TYPE.TIME],
    "datetime": decoders[FIELD_TYPE.DATETIME],
    "timestamp": decoders[FIELD_TYPE.TIMESTAMP],
    "year": decoders[FIELD_TYPE.YEAR],
    "float": decoders[FIELD_TYPE.FLOAT],
    "double": decoders[FIELD_TYPE.DOUBLE],
}


def _literal(text: str) -> str:
    """A column name as a JSON key: a hex string literal, which reads the same under every
    ``sql_mode`` (``NO_BACKSLASH_ESCAPES`` changes what a quoted one means)."""
    return "_utf8mb4 X'" + text.encode().hex() + "'"


class JsonChunks:
    """The JSON form of one table's chunk reads, or ``None`` from :meth:`of` where a column's
    type cannot make the trip unchanged (see the module)."""

    def __init__(self, pairs: list[str], converters: list[tuple[str, Convert]]) -> None:
        self.pairs = ", ".join(pairs)
        self.converters = converters

    @classmethod
    def of(cls, columns: Sequence[Mapping[str, Any]]) -> JsonChunks | None:
        """``columns``: the catalog's rows for the table (``COLUMN_NAME``, ``DATA_TYPE``,
        ``COLUMN_TYPE``, ``CHARACTER_SET_NAME``), in the table's order."""
        pairs: list[str] = []
        converters: list[tuple[str, Convert]] = []
        for c in columns:
            name, typ = c["COLUMN_NAME"], str(c["DATA_TYPE"]).lower()
            col = quote_ident(name)
            if typ in INTEGERS and "zerofill" not in str(c["COLUMN_TYPE"]).lower():
                value = col
            elif c["CHARACTER_SET_NAME"] is not None:
                value = f"CAST({col} AS CHAR)"
            elif typ in BINARY:
                value = f"HEX({col})"
                converters.append((name, bytes.fromhex))
            elif typ in TEXT_TYPES:
                value = f"CAST({col} AS CHAR)"
            elif typ in AS_TEXT or typ in INTEGERS:
                value = f"CAST({col} AS CHAR)"
                converters.append((name, AS_TEXT.get(typ, int)))
            else:
                return None
            pairs.append(f"{_literal(name)}, {value}")
        return cls(pairs, converters)

    def query(self, select: str, target: str, where: str, keys: str) -> str:
        """One row: the chunk's row count and its rows as a JSON array, in key order."""
        return (
            f"SELECT COUNT(*) AS n, JSON_ARRAYAGG(JSON_OBJECT({self.pairs}) ORDER BY {keys}) AS doc "
            f"FROM (SELECT {select} FROM {target}{where} ORDER BY {keys} LIMIT %s) AS chunk"
        )

    def rows(self, count: int, document: str | bytes | None) -> list[Row] | None:
        """The chunk's rows, or ``None`` when the document is not all of them."""
        if count == 0:
            return []
        if document is None:
            return None
        try:
            rows: list[Row] = orjson.loads(document)
            if len(rows) != count:
                return None
            for name, convert in self.converters:
                for r in rows:
                    v = r[name]
                    if v is not None:
                        r[name] = convert(v)
        except (ValueError, TypeError, KeyError):  # orjson.JSONDecodeError is a ValueError
            return None
        return rows
