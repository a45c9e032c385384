"""PostgreSQL table names: ``table`` or ``schema.table`` (``public`` by default), quoted."""

from __future__ import annotations


def split(name: str) -> tuple[str, str]:
    """``(schema, table)``."""
    schema, _, table = name.rpartition(".")
    return schema or "public", table


def quote_ident(name: str) -> str:
    """A PostgreSQL identifier, quoted (a double quote in it doubled)."""
    return '"' + name.replace('"', '""') + '"'


def qualified(name: str) -> str:
    """``table`` or ``schema.table`` as ``schema.table``."""
    return ".".join(split(name))


def quote_table(name: str) -> str:
    schema, table = split(name)
    return f"{quote_ident(schema)}.{quote_ident(table)}"


PRIMARY_KEY = (
    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
    "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::oid AND i.indisprimary "
    "ORDER BY array_position(i.indkey::int2[], a.attnum)"
)
"""A table's primary-key columns in key order, by its OID (``%s``)."""
