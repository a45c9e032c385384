"""Envelopes a decoder child made (``Event.encoded``), checked where ``serve`` receives them.

The MySQL/MariaDB decoder child makes each change's native envelope from the events ``serve``
makes of the same frame, with the same code and the same opening (txevents.py), so they agree.
(PostgreSQL's child does not: making them there was slower, docs/performance.md.) Were they ever not to (a bug in keeping the two sides alike), the first envelope of every
frame, checked against ``serve``'s own, finds it: that source then stops asking for them, and the
frame's events go on without, the sinks making their own. No change is lost either way.
"""

from __future__ import annotations

import structlog

from deltaforge.envelopes import encode, native
from deltaforge.events import Event, with_images

log = structlog.get_logger()


def agree(source: str, events: list[Event]) -> bool:
    """Whether the first envelope made by the child among ``events`` is ``serve``'s own for its
    event; if not, an error says which event (the caller stops asking for them and takes
    :func:`without_made`)."""
    for e in events:
        if e.encoded is not None:
            if e.encoded == encode(native(e)):
                return True
            log.error(
                "child_envelope_mismatch", source=source, table=e.source.table, event_id=e.event_id,
                reason="the decoder child made a native envelope other than serve's own for this change "
                "(a bug): serve makes every envelope itself from now on",
            )  # fmt: skip
            return False
    return True


def without_made(events: list[Event]) -> list[Event]:
    """The same events with no envelope made elsewhere: the sinks make their own."""
    return [with_images(e, e.op, e.before, e.after) for e in events]
