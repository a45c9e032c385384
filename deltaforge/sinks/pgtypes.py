"""How a change's value reaches a PostgreSQL target column: as asyncpg's binary codec takes it,
or as the type's text, cast by the target.

asyncpg encodes each parameter with the binary codec of the type the server infers for it, and
those codecs want particular Python values: a ``time`` column a ``datetime.time``, an
``interval`` a ``timedelta``, an array a list of values of its element type, a range an
``asyncpg.Range``. The sources hand on what they read: the PostgreSQL source gives every type
it does not parse as the server's own text (``'12:30:01.5'``, ``'[1,5)'``, ``'B101'``), arrays
as lists, and ``'infinity'`` for an infinite timestamp; MySQL gives a ``TIME`` as a
``timedelta``. So every such column failed the whole change as a poison event: a PostgreSQL
table with a ``time`` or a ``text[]`` column could not be copied to PostgreSQL at all.

The sink reads its target table's column types once (:func:`column_forms`) and sends a column
of any type outside :data:`NATIVE` as text, ``$n::text::<type>``, written by :func:`pg_text`
(PostgreSQL's own text is passed on as it is, so it round-trips exactly); the types asyncpg
takes natively stay binary. An infinite date or timestamp becomes asyncpg's infinity, a real's
NaN or infinity (the source's text) a float, MySQL's 0/1 flags booleans and its BIT(n) bytes bit
text. The same read says which columns the target computes (generated: not written) and which
number themselves (identity ``GENERATED ALWAYS``: written with ``OVERRIDING SYSTEM VALUE``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, NamedTuple

import asyncpg
import orjson

from deltaforge.envelopes import bytes_from_json, json_default

NATIVE = frozenset(
    {
        "bool", "int2", "int4", "int8", "oid", "float4", "float8", "numeric", "text", "varchar", "bpchar",
        "name", "bytea", "json", "jsonb", "uuid", "inet", "cidr", "macaddr", "macaddr8", "money",
        "xml", "tsvector", "tsquery", "date", "timestamp", "timestamptz",
    }
)  # fmt: skip
"""Base types whose values, as the sources give them, asyncpg encodes as they are (a str where
asyncpg has no binary codec for the type: it then sends the text itself). Enums too. Not
``"char"``, whose codec takes bytes (the PostgreSQL source gives its text)."""


def plain(value: Any) -> Any:
    """A value for a column asyncpg encodes natively: a document (dict, list) as its JSON text,
    as json/jsonb parameters travel; a Python set (what MySQL SETs once were) as MySQL's text."""
    if isinstance(value, dict | list):
        return orjson.dumps(value, default=json_default).decode()
    if isinstance(value, set | frozenset):
        return ",".join(sorted(value))
    return value


# asyncpg's own infinities (asyncpg/pgproto codecs/datetime.pyx): the values it encodes as them
_INFINITE: dict[str, dict[str, Any]] = {
    "date": {"infinity": dt.date.max, "-infinity": dt.date.min},
    "timestamp": {"infinity": dt.datetime.max, "-infinity": dt.datetime.min},
    "timestamptz": {"infinity": dt.datetime.max, "-infinity": dt.datetime.min},
}


def _real(value: Any) -> Any:
    """A real or double: the PostgreSQL source gives NaN and the infinities as their text (any
    other text is left for asyncpg to refuse)."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _bool(value: Any) -> Any:
    """A boolean: MySQL has none, so a TINYINT(1) (an int) or a BIT(1) (a byte) holding 0 or 1
    is taken as false or true; any other value is left for asyncpg to refuse."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if isinstance(value, bytes) and value in (b"\x00", b"\x01"):
        return value == b"\x01"
    if value in ("AA==", "AQ=="):  # a BIT(1)'s byte read back from a topic: base64
        return value == "AQ=="
    return value


def _byte_array(value: Any) -> Any:
    """A ``bytea[]``: its elements as a bytea's (a list read back from a topic holds base64
    text), then the array's text."""

    def decoded(v: Any) -> Any:
        return [decoded(x) for x in v] if isinstance(v, list) else bytes_from_json(v)

    return pg_text(decoded(value) if isinstance(value, list) else value)


def _bits(width: int) -> Callable[[Any], Any]:
    """A ``bit(width)`` (``varbit``: width 0) column's text: MySQL's BIT(n) arrives as the bytes
    that hold its bits, right-aligned, which become as many bits as the column has (a varbit
    takes all the bytes' bits), or, read back from a topic, as their base64 (text that is not
    all 0s and 1s: base64 of bytes all of whose characters are is taken as bit text);
    PostgreSQL's own bit text is passed on."""

    def adapt(value: Any) -> Any:
        if isinstance(value, str) and value.strip("01"):  # not bit text: base64, read back from a topic
            value = bytes_from_json(value)
        if isinstance(value, bytes):
            return format(int.from_bytes(value, "big"), f"0{width or len(value) * 8}b")
        return pg_text(value)

    return adapt


def _instant(infinite: dict[str, Any]) -> Callable[[Any], Any]:
    """A date or timestamp: infinity as asyncpg's, and ISO text (what a date or time becomes in
    JSON: read back from a Kafka topic) as the date or time it writes; a naive one then goes as a
    naive ``datetime`` does. Other text (a BC date) is left for asyncpg to refuse."""

    def adapt(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if (known := infinite.get(value)) is not None:
            return known
        try:
            return dt.datetime.fromisoformat(value)  # a date's text too: its midnight
        except ValueError:
            return value

    return adapt


def pg_text(value: Any) -> str | None:
    """``value`` as PostgreSQL's input text: a str as it is (the PostgreSQL source's values of
    types it does not parse are the server's own text), a list as an array literal (elements
    quoted, NULL for None, nested lists as nested arrays), bytes as ``\\x`` hex, a document as
    JSON, a timedelta as a time of day or interval, a date or time in ISO form."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, list | tuple):
        return "{" + ",".join(_element(v) for v in value) + "}"
    if isinstance(value, dict):
        return orjson.dumps(value, default=json_default).decode()
    if isinstance(value, dt.timedelta):
        return str(json_default(value))  # [-]H:MM:SS[.ffffff], which time and interval read
    if isinstance(value, dt.date | dt.time):  # a datetime is a date
        return value.isoformat()
    if isinstance(value, set | frozenset):
        return ",".join(sorted(value))
    return str(value)  # int, float (inf, nan read back), Decimal


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list | tuple):
        return pg_text(value) or "{}"
    text = pg_text(value) or ""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quoted(name: str) -> str:
    """A PostgreSQL identifier, quoted (its own double quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


class ColumnForm(NamedTuple):
    """How one target column takes its values: ``cast`` the SQL type its parameter is cast to
    from text (None: sent natively), ``adapt`` what makes the parameter of a change's value;
    ``generated`` a column the target computes (``GENERATED ALWAYS AS (...) STORED``: not
    written), ``always`` an identity column that takes a value only with ``OVERRIDING SYSTEM
    VALUE`` (``GENERATED ALWAYS AS IDENTITY``)."""

    cast: str | None
    adapt: Callable[[Any], Any]
    generated: bool = False
    always: bool = False


NATIVE_FORM = ColumnForm(None, plain)
"""A column whose type is not known (the table is not there yet: the statement then fails
as it did before the sink knew types)."""

_COLUMNS = """
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, b.typname AS base, b.typtype = 'e' AS enum,
       a.atttypmod AS mod, a.attgenerated <> '' AS generated, a.attidentity = 'a' AS always
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
"""


async def column_forms(conn: asyncpg.Connection, table: str) -> dict[str, ColumnForm]:
    """Each column of ``table`` (a quoted, maybe schema-qualified name) and its form; empty when
    the table does not exist."""
    forms: dict[str, ColumnForm] = {}
    for r in await conn.fetch(_COLUMNS, table):
        forms[r["name"]] = _form(r)._replace(generated=r["generated"], always=r["always"])
    return forms


def _form(r: asyncpg.Record) -> ColumnForm:
    """How a column of ``r``'s type takes its values."""
    base = str(r["base"])
    if base in ("float4", "float8"):
        return ColumnForm(None, _real)
    if base == "bool":
        return ColumnForm(None, _bool)
    if base in ("bit", "varbit"):
        return ColumnForm(str(r["type"]), _bits(max(int(r["mod"]), 0) if base == "bit" else 0))
    if base in _INFINITE:
        return ColumnForm(None, _instant(_INFINITE[base]))
    if base == "bytea":  # JSON has no bytes: read back from a topic, base64 text (other text: refused)
        return ColumnForm(None, bytes_from_json)
    if base == "_bytea":
        return ColumnForm(str(r["type"]), _byte_array)
    if base in NATIVE or r["enum"]:  # an enum takes its label
        return NATIVE_FORM
    return ColumnForm(str(r["type"]), pg_text)


_PRIMARY_KEY = """
SELECT a.attname AS name
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary
ORDER BY array_position(i.indkey, a.attnum)
"""


async def primary_key(conn: asyncpg.Connection, table: str) -> tuple[str, ...]:
    """The primary-key columns of ``table`` (a quoted, maybe schema-qualified name), in the key's
    order; empty without one, or without the table."""
    return tuple(str(r["name"]) for r in await conn.fetch(_PRIMARY_KEY, table))
