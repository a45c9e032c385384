"""pgoutput tuples as rows: the decoder child's per-column work, once per value of every change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltaforge.sources.postgres.pgoutput import UNCHANGED_TOAST


def row(names: list[str], convs: list[Any], values: list[Any]) -> dict[str, Any]:
    """A pgoutput tuple's values as a row: each text value converted (``convs``: a function per
    column, None to keep the text), None kept, an unchanged TOASTed value marked."""
    out: dict[str, Any] = {}
    for name, conv, value in zip(names, convs, values, strict=False):
        if value is None or (conv is None and value is not UNCHANGED_TOAST):
            out[name] = value
        elif value is UNCHANGED_TOAST:
            out[name] = {"__unchanged_toast__": True}
        else:
            out[name] = conv(value) if isinstance(value, str) else value
    return out


RowBuilder = Callable[[list[Any]], dict[str, Any]]


def row_builder(names: list[str], convs: list[Any]) -> RowBuilder:
    """:func:`row` for one relation's columns, as code made for them (once per Relation message):
    each column's test and conversion written out, no loop, no zip. A tuple of another length than
    the relation's goes through :func:`row` itself."""
    n = len(names)
    ns: dict[str, Any] = {"_T": UNCHANGED_TOAST, "_row": row, "_names": names, "_convs": convs}
    items = []
    for i, (name, conv) in enumerate(zip(names, convs, strict=True)):
        ns[f"_k{i}"] = name
        toast = f"(v{i} if v{i} is not _T else {{'__unchanged_toast__': True}})"
        if conv is None:
            items.append(f"_k{i}: {toast}")
        else:
            ns[f"_c{i}"] = conv
            items.append(f"_k{i}: (_c{i}(v{i}) if v{i}.__class__ is str else {toast})")
    unpack = f"    {''.join(f'v{i}, ' for i in range(n))}= values\n" if n else ""
    code = (
        f"def build(values):\n    if len(values) != {n}:\n        return _row(_names, _convs, values)\n"
        f"{unpack}    return {{{', '.join(items)}}}\n"
    )
    exec(code, ns)
    return ns["build"]  # type: ignore[no-any-return]
