"""Declared SQL column types to Arrow types, per source connector.

Only what a value of that column reliably is in Python becomes a precise type;
anything else maps to string, and a batch whose values do not fit the declared
types is typed from its values instead (``arrow.to_arrow``), never truncated.
"""

from __future__ import annotations

import re

import pyarrow as pa

from deltaforge.sources.base import DeclaredTable
from deltaforge.transform.arrow import TableSchema

_DECIMAL = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")


def table_schema(declared: DeclaredTable, connector: str) -> TableSchema:
    """A source table's declared columns as an Arrow :class:`TableSchema`."""
    mapper = {"turso": sqlite_type, "mysql": mysql_type, "postgres": postgres_type}.get(connector, _text)
    json = frozenset(name for name, typ in declared.columns if typ.lower() in ("json", "jsonb"))
    return TableSchema(
        declared.db, declared.table, tuple((name, mapper(typ)) for name, typ in declared.columns), json
    )


def _text(declared: str) -> pa.DataType:
    return pa.string()


def sqlite_type(declared: str) -> pa.DataType:
    """SQLite's type-affinity rules (https://sqlite.org/datatype3.html, section 3.1)."""
    t = declared.upper()
    if "INT" in t:
        return pa.int64()
    if any(k in t for k in ("CHAR", "CLOB", "TEXT")):
        return pa.string()
    if "BLOB" in t:
        return pa.binary()
    if any(k in t for k in ("REAL", "FLOA", "DOUB")):
        return pa.float64()
    return pa.string()  # NUMERIC affinity or none: values decide (see module doc)


def mysql_type(declared: str) -> pa.DataType:
    """A MySQL/MariaDB ``COLUMN_TYPE`` (``int(11) unsigned``, ``decimal(10,2)``, ...)."""
    t = declared.lower()
    base = t.split("(")[0].split()[0] if t else ""
    if base in ("tinyint", "smallint", "mediumint", "int", "integer", "year"):
        return pa.int64()
    if base == "bigint":
        return pa.decimal128(20, 0) if "unsigned" in t else pa.int64()
    if base in ("float", "double", "real"):
        return pa.float64()
    if base in ("decimal", "numeric"):
        return _decimal(t)
    if base in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"):
        return pa.string()
    if base in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return pa.binary()
    if base == "date":
        return pa.date32()
    if base == "datetime":
        return pa.timestamp("us")  # a wall-clock time, no zone
    if base == "timestamp":
        return pa.timestamp("us", tz="UTC")  # an instant (the source reads it as aware UTC)
    return pa.string()


def postgres_type(declared: str) -> pa.DataType:
    """A PostgreSQL ``format_type`` name (``numeric(10,2)``, ``timestamp with time zone``, ...)."""
    t = declared.lower()
    if t in ("smallint", "integer", "bigint"):
        return pa.int64()
    if t in ("real", "double precision"):
        return pa.float64()
    if t.startswith("numeric") and "(" in t:
        return _decimal(t)
    if t == "boolean":
        return pa.bool_()
    if t == "date":
        return pa.date32()
    if t.startswith("timestamp"):
        return pa.timestamp("us", tz="UTC") if "with time zone" in t else pa.timestamp("us")
    if t == "bytea":
        return pa.binary()
    return pa.string()


def _decimal(declared: str) -> pa.DataType:
    m = _DECIMAL.search(declared)
    if not m:
        return pa.string()
    precision, scale = int(m.group(1)), int(m.group(2) or 0)
    if not 1 <= precision <= 38:
        return pa.string()
    return pa.decimal128(precision, scale)
