"""Per-event name templates: ``cdc.${source.table}``, ``${after.customer_id}``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator

from deltaforge.configmodel import Text, fail
from deltaforge.events import Event
from deltaforge.sinks.base import PoisonEvent

_PART = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\}")
_SOURCE = {"table", "db", "schema", "connector"}


class TemplateUnresolved(PoisonEvent):
    """A template names a column this event's row does not have."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "routing")


def _getter(path: str) -> Callable[[Event], Any]:
    head, _, rest = path.partition(".")
    if head == "source" and rest in _SOURCE:
        return lambda e: getattr(e.source, rest)
    if head in ("after", "before") and "." not in rest:
        # a delete has no after image: fall back to before, so keys stay stable per row
        def image(e: Event) -> Any:
            row = getattr(e, head) if getattr(e, head) is not None else (e.before or e.after)
            if not row or rest not in row:
                # Routing it anywhere else (an empty name) would deliver it where nobody looks.
                raise TemplateUnresolved(f"${{{path}}} does not resolve: the row has no column {rest!r}")
            return row[rest]

        return image
    raise ValueError(
        f"unknown template field ${{{path}}}; expected source.table/db/schema/connector, after.COL or before.COL"
    )


def is_fixed(text: str) -> bool:
    """A text with no ``${...}`` placeholder: the same name for every event."""
    return _PART.search(text) is None


def compile_template(text: str) -> Callable[[Event], str]:
    """A function from event to name; a text without ``${...}`` is returned as is (fast path)."""
    parts = _PART.split(text)
    if len(parts) == 1:
        return lambda e: text
    getters: list[str | Callable[[Event], Any]] = [
        p if i % 2 == 0 else _getter(p) for i, p in enumerate(parts)
    ]

    def render(e: Event) -> str:
        return "".join(g if isinstance(g, str) else str(g(e)) for g in getters)

    if any(p.partition(".")[0] != "source" for p in parts[1::2]):
        return render
    # Names from source fields only (the usual ``cdc.${source.table}``): one per table, kept.
    # Rendering per event was a third of the Kafka sink's record building.
    names: dict[tuple[str, str, str | None, str], str] = {}

    def by_table(e: Event) -> str:
        s = e.source
        key = (s.connector, s.db, s.schema, s.table)
        name = names.get(key)
        if name is None:
            name = names[key] = render(e)
        return name

    return by_table


def check_template(text: str) -> str | None:
    """None when ``text`` is a valid template, else what is wrong (for config validation)."""
    try:
        compile_template(text)
    except ValueError as exc:
        return str(exc)
    return None


def _check(text: str) -> str:
    problem = check_template(text)
    if problem:
        fail(problem)
    return text


Template = Annotated[Text, AfterValidator(_check)]
"""A config field holding a per-event name template (checked when the config is)."""
