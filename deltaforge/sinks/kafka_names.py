"""Kafka's rule for topic names, applied before anything is sent (``names.py``).

A broker refuses a record for a topic whose name breaks the rule, but how that refusal reaches
the sink depends on timing: as the broker's ``TOPIC_EXCEPTION`` for the first records, and as
librdkafka's local ``_UNKNOWN_TOPIC`` (which reads as "not created yet", so retryable) once its
metadata cache has the answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Annotated

from pydantic import AfterValidator

from deltaforge.events import Event
from deltaforge.sinks.names import IllegalName, checked_renderer, fixed_name_check
from deltaforge.sinks.templates import Template

_LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_problem(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name (Kafka's ``Topic.validate``), or None."""
    if _LEGAL.fullmatch(name) and name not in (".", ".."):
        return None
    return f"{name!r} is not a legal Kafka topic name (1-249 letters, digits, '.', '_' or '-')"


class IllegalTopic(IllegalName):
    """A template rendered a topic name Kafka does not allow for this event."""


# topic_problem looked up when called, here as in refuse_illegal (a test passes a name the broker refuses)
TopicTemplate = Annotated[Template, AfterValidator(fixed_name_check(lambda name: topic_problem(name)))]
"""A topic template; a name without placeholders must already be a legal topic name."""


def topic_renderer(template: str, sink_id: str) -> Callable[[Event], str]:
    """The topic per event, a rendered one checked against Kafka's rule (``names.checked_renderer``)."""
    return checked_renderer(template, partial(refuse_illegal, sink_id))


def refuse_illegal(sink_id: str, name: str) -> None:
    """Raise :class:`IllegalTopic` for a rendered topic name Kafka does not allow."""
    problem = topic_problem(name)
    if problem:
        raise IllegalTopic(f"kafka sink {sink_id!r}: topic {problem}")
