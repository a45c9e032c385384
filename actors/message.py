"""Typed messages: frozen, slotted dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar, dataclass_transform

T = TypeVar("T")
R = TypeVar("R")


class Ask(Generic[R]):
    """Base of a message that is asked and answered with an ``R``.

    ``await ref.ask(msg)`` is then typed ``R``::

        >>> from actors import Ask, message
        >>> @message
        ... class HowMany(Ask[int]):
        ...     since: float
    """

    __slots__ = ()


@dataclass_transform(frozen_default=True)
def message(cls: type[T]) -> type[T]:
    """Class decorator for actor messages.

    Messages cross task boundaries, so they must not change after they are sent:
    ``frozen`` forbids it and ``slots`` keeps them small (a pipeline moves many).
    Name them as facts (``BatchDelivered``) or commands (``CommitCheckpoint``).
    """
    return dataclass(frozen=True, slots=True)(cls)
