"""Names a sink renders from a template (a Kafka topic, a NATS subject), checked against the
server's rule before anything of a batch is sent.

Left to the server, a name that breaks its rule is refused in ways that depend on timing and on
the client: as poison for some records and as "not there yet" (retryable) for others, after the
records before it were sent, or not at all (a NATS subject with an empty token has no stream
answer it). Checked here, such a name is always what it is: a fixed name is a config error, a
name a template rendered is the event's fault (poison, ``routing``).
"""

from __future__ import annotations

from collections.abc import Callable

from deltaforge.configmodel import fail
from deltaforge.events import Event
from deltaforge.sinks.base import PoisonEvent
from deltaforge.sinks.templates import compile_template, from_source_only, is_fixed

Problem = Callable[[str], str | None]
"""Why a name breaks the server's rule, or None."""


class IllegalName(PoisonEvent):
    """A template rendered a name the server does not allow for this event."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "routing")


def fixed_name_check(problem: Problem) -> Callable[[str], str]:
    """A config validator: a template without placeholders must already be a legal name."""

    def check(text: str) -> str:
        found = problem(text) if is_fixed(text) else None
        if found:
            fail(found)
        return text

    return check


def checked_renderer(template: str, refuse: Callable[[str], None]) -> Callable[[Event], str]:
    """The name per event: a fixed name as it is (the config check has passed it), a rendered one
    passed to ``refuse`` (which raises :class:`IllegalName` for an illegal one): a name from
    source fields once, when the template first renders it (it keeps the names it checked), one
    from row values by :class:`CheckedName`."""
    if is_fixed(template):
        return compile_template(template)
    if from_source_only(template):
        return compile_template(template, refuse)
    return CheckedName(compile_template(template), refuse)


class CheckedName:
    """Renders a name and refuses an illegal one; names found legal are remembered, so after the
    first time a name costs one set lookup."""

    def __init__(self, render: Callable[[Event], str], refuse: Callable[[str], None]) -> None:
        self.render = render
        self.refuse = refuse
        self._legal: set[str] = set()

    def __call__(self, e: Event) -> str:
        name = self.render(e)
        if name in self._legal:
            return name
        self.refuse(name)
        if len(self._legal) >= 4096:  # names from row values (cdc.${after.region}) must not pile up
            self._legal.clear()
        self._legal.add(name)
        return name
