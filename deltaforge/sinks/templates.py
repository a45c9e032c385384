"""Per-event name templates: ``cdc.${source.table}``, ``${after.customer_id}``."""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import attrgetter
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


def glob_of(text: str) -> str:
    """A Redis ``MATCH`` pattern for every name the template renders: each placeholder ``*``, the
    rest escaped."""
    parts = _PART.split(text)  # literal, field, literal, field, ..., literal
    return "*".join(re.sub(r"([*?\[\]\\])", r"\\\1", part) for part in parts[::2])


def compile_template(text: str, check: Callable[[str], object] | None = None) -> Callable[[Event], str]:
    """A function from event to name; a text without ``${...}`` is returned as is (fast path).

    A template of source fields only (:func:`from_source_only`) renders each name once and keeps
    it, after ``check`` (if given) has seen it: ``check`` may raise to refuse a name, which is
    then rendered and checked again for the next event. Other templates render per event and
    never call ``check``."""
    parts = _PART.split(text)
    if len(parts) == 1:
        return lambda e: text
    getters: list[str | Callable[[Event], Any]] = [
        p if i % 2 == 0 else _getter(p) for i, p in enumerate(parts)
    ]

    def render(e: Event) -> str:
        return "".join(g if isinstance(g, str) else str(g(e)) for g in getters)

    if not _source_only(parts):
        return render
    # Names from source fields only (the usual ``cdc.${source.table}``): one per table, kept.
    # Rendering per event was a third of the Kafka sink's record building; looking the kept
    # name up by a tuple of the four fields, and checking it in a second call, still 0.9 µs of
    # its 2.8 µs a record (docs/performance.md): one field is looked up by its value alone.
    fields = list(dict.fromkeys(p.partition(".")[2] for p in parts[1::2]))
    key_of = attrgetter(f"source.{fields[0]}") if len(fields) == 1 else _source_fields
    names: dict[Any, str] = {}

    def by_source(e: Event) -> str:
        name = names.get(key_of(e))
        if name is None:
            name = render(e)
            if check is not None:
                check(name)
            names[key_of(e)] = name
        return name

    return by_source


def _source_fields(e: Event) -> tuple[str, str, str | None, str]:
    s = e.source
    return s.connector, s.db, s.schema, s.table


def from_source_only(text: str) -> bool:
    """Whether every placeholder of ``text`` names a source field: one name per table at most."""
    return _source_only(_PART.split(text))


def _source_only(parts: list[str]) -> bool:
    """``text`` split by :data:`_PART`: placeholders at odd indexes."""
    return len(parts) > 1 and all(p.partition(".")[0] == "source" for p in parts[1::2])


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
