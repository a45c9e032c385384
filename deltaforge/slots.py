"""Instances of frozen, slotted dataclasses built without a call per field: the hot paths'
constructor (events, pgoutput changes)."""

from __future__ import annotations

from typing import Any


def slot_constructor(
    cls: type[Any], given: tuple[str, ...] | None = None, reset: tuple[str, ...] = ()
) -> Any:
    """A function building an instance of the frozen, slotted dataclass ``cls`` without its
    frozen ``__init__``: what sources build per row (events.py), processors per kept event, and
    the PostgreSQL decoder per change message (pgoutput.py). It takes
    every field in order (the last of them, ``reset``, optional: None), or, with ``given``, an
    instance to copy and those fields to replace, ``reset`` set to None.

    The frozen ``__init__`` sets each field through ``object.__setattr__``, a call per field.
    This builds an instance of a twin class with the same slots and no frozen ``__setattr__``,
    whose plain attribute stores CPython specialises for slots, then makes it a ``cls``
    (``__class__`` may change between classes of one layout). Generated code, as ``dataclasses``
    itself does; tests/test_transform_types.py checks it against the constructor."""
    names = cls.__slots__
    twin = type(f"_{cls.__name__}Slots", (), {"__slots__": names})
    ns: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    params = (
        [*(n for n in names if n not in reset), *(f"{n}=None" for n in reset)]
        if given is None
        else ["__src", *given]
    )
    values = ["None" if given is not None and n in reset else n if given is None or n in given else f"__src.{n}"
              for n in names]  # fmt: skip
    # The instance and the one copied are ``__o`` and ``__src``, which no field can be named (slots
    # would mangle it): a field named ``new`` once got the instance itself as its value.
    body = "".join(f"    __o.{n} = {v}\n" for n, v in zip(names, values, strict=True))
    head = f"def build({', '.join(params)}):\n    __o = _new(_twin)\n"
    exec(f"{head}{body}    __o.__class__ = _cls\n    return __o\n", ns)
    return ns["build"]
