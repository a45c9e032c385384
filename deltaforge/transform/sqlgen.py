"""Processors as Spark SQL text.

A chain of filters and masks becomes one ``SELECT`` over the view of the
batch, so Spark parses and analyses it once per batch instead of once per
DataFrame call (measured on a warm session, filter + mask on 1k rows: 36-41 ms
of DataFrame-API calls against 15-20 ms for the view and one query).
"""

from __future__ import annotations

from typing import Any

from deltaforge.transform.spec import REDACTED

IN_VIEW = "__deltaforge_in"
BATCH_VIEW = "batch"
IMAGES = ("before", "after")


def ident(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A quoted Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def base_query() -> str:
    return f"SELECT * FROM {IN_VIEW}"


def filter_query(query: str, expr: str) -> str:
    return f"SELECT * FROM ({query}) WHERE ({expr})"


def masked(value: str, action: str | None) -> str:
    """The SQL of ``value`` hashed or redacted (``action`` ``hash``/``redact``; anything else: as is)."""
    if action == "hash":
        return f"sha2(cast({value} AS STRING), 256)"
    if action == "redact":
        return f"CASE WHEN {value} IS NULL THEN NULL ELSE {literal(REDACTED)} END"
    return value


def mask_query(query: str, schema: Any, columns: dict[str, str]) -> str:
    """``query`` with ``columns`` of both row images hashed, redacted or dropped.

    ``schema`` is the Spark ``StructType`` that ``query`` returns; only columns the
    images have are touched (the caller checks scoped masks beforehand).
    """
    select: list[str] = []
    for field in schema.fields:
        name = field.name
        if name not in IMAGES or not hasattr(field.dataType, "fields"):
            select.append(ident(name))
            continue
        parts: list[str] = []
        for sub in field.dataType.fields:
            value = f"{ident(name)}.{ident(sub.name)}"
            action = columns.get(sub.name)
            if action == "drop":
                continue
            parts.append(f"{literal(sub.name)}, {masked(value, action)}")
        image = f"named_struct({', '.join(parts)})"
        # a missing row image (before of an insert) stays missing, not a struct of nulls
        select.append(f"CASE WHEN {ident(name)} IS NULL THEN NULL ELSE {image} END AS {ident(name)}")
    return f"SELECT {', '.join(select)} FROM ({query})"
