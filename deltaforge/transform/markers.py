"""Values a change does not carry, kept out of Spark and put back after it.

A source marks a value its change does not carry: PostgreSQL's unchanged TOAST value
(``{"__unchanged_toast__": true}``), a column a partial MySQL row image left out
(``{"__not_logged__": true}``). It is not a value: sent to Spark as one, a mask hashed the
marker's JSON text (and a sink wrote that hash over the value the row holds), and the marker
made its whole column JSON text for that batch, so every other value in it was hashed with its
quotes. Spark sees such a value as NULL, what SQL knows of it (a filter on it is unknown), and
the marker comes back wherever the result still has the column and NULL in it.
"""

from __future__ import annotations

from typing import Any

from deltaforge.events import Event, not_carried, with_images

Carried = dict[int, list[tuple[str, str, dict[str, Any]]]]
"""Per event index, the markers taken out: (image, column, marker)."""

_NONE: dict[str, Any] = {}


def strip(events: list[Event], indices: list[int]) -> tuple[list[Event], Carried]:
    """``events`` with the markers of those at ``indices`` as None (the list itself when none has
    one), and the markers taken out."""
    carried: Carried = {}
    out = events
    for i in indices:
        e = events[i]
        after, before = e.after or _NONE, e.before or _NONE
        if dict not in map(type, after.values()) and dict not in map(type, before.values()):
            continue  # most events hold no dict at all: one look at both images' value types, in C
        taken: list[tuple[str, str, dict[str, Any]]] = []
        images: dict[str, dict[str, Any] | None] = {"before": e.before, "after": e.after}
        for name, image in images.items():
            if image is not None and any(type(v) is dict for v in image.values()):
                marked = [c for c, v in image.items() if not_carried(v)]
                if marked:
                    taken += [(name, c, image[c]) for c in marked]
                    images[name] = {**image, **dict.fromkeys(marked)}
        if taken:
            if out is events:
                out = list(events)
            out[i] = with_images(e, e.op, images["before"], images["after"])
            carried[i] = taken
    return out, carried


def restore(part: list[tuple[int, Event]], carried: Carried) -> list[tuple[int, Event]]:
    """``part`` (a job's events by index) with each marker back where its column is still there
    and NULL (a column a mask dropped stays dropped; a value a processor set stays)."""
    if not carried:
        return part
    out = []
    for i, e in part:
        if (taken := carried.get(i)) is not None:
            images: dict[str, dict[str, Any] | None] = {"before": e.before, "after": e.after}
            for name, column, marker in taken:
                image = images[name]
                if image is not None and column in image and image[column] is None:
                    images[name] = {**image, column: marker}
            e = with_images(e, e.op, images["before"], images["after"])
        out.append((i, e))
    return out
