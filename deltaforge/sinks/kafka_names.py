"""Kafka's rule for topic names, applied before anything is sent.

A broker refuses a record for a topic whose name breaks the rule, but how that refusal reaches
the sink depends on timing: as the broker's ``TOPIC_EXCEPTION`` for the first records, and as
librdkafka's local ``_UNKNOWN_TOPIC`` (which reads as "not created yet", so retryable) once its
metadata cache has the answer. Checked here, such a name is always what it is: a fixed name is a
config error, a name a template rendered is the event's fault (poison, ``routing``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Annotated

from pydantic import AfterValidator

from deltaforge.configmodel import fail
from deltaforge.events import Event
from deltaforge.sinks.base import PoisonEvent
from deltaforge.sinks.templates import Template, compile_template, from_source_only, is_fixed

_LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_problem(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name (Kafka's ``Topic.validate``), or None."""
    if _LEGAL.fullmatch(name) and name not in (".", ".."):
        return None
    return f"{name!r} is not a legal Kafka topic name (1-249 letters, digits, '.', '_' or '-')"


class IllegalTopic(PoisonEvent):
    """A template rendered a topic name Kafka does not allow for this event."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "routing")


def _check_fixed(text: str) -> str:
    problem = topic_problem(text) if is_fixed(text) else None
    if problem:
        fail(problem)
    return text


TopicTemplate = Annotated[Template, AfterValidator(_check_fixed)]
"""A topic template; a name without placeholders must already be a legal topic name."""


def topic_renderer(template: str, sink_id: str) -> Callable[[Event], str]:
    """The topic per event: a fixed name as it is (the config check has passed it), a rendered
    one checked against Kafka's rule: a name from source fields once, when the template first
    renders it (it keeps the names it checked), one from row values by :class:`CheckedTopic`."""
    if is_fixed(template):
        return compile_template(template)
    if from_source_only(template):
        return compile_template(template, partial(refuse_illegal, sink_id))
    return CheckedTopic(compile_template(template), sink_id)


def refuse_illegal(sink_id: str, name: str) -> None:
    """Raise :class:`IllegalTopic` for a rendered topic name Kafka does not allow."""
    problem = topic_problem(name)
    if problem:
        raise IllegalTopic(f"kafka sink {sink_id!r}: topic {problem}")


class CheckedTopic:
    """Renders a topic and refuses an illegal one; names found legal are remembered, so after the
    first time a name costs one set lookup."""

    def __init__(self, render: Callable[[Event], str], sink_id: str) -> None:
        self.render = render
        self.sink_id = sink_id
        self._legal: set[str] = set()

    def __call__(self, e: Event) -> str:
        name = self.render(e)
        if name in self._legal:
            return name
        refuse_illegal(self.sink_id, name)
        if len(self._legal) >= 4096:  # names from row values (cdc.${after.region}) must not pile up
            self._legal.clear()
        self._legal.add(name)
        return name
