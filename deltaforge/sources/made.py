"""Records a decoder child made (``Event.made``), checked where ``serve`` receives them.

The decoder children (MySQL/MariaDB and PostgreSQL) make each change's native envelope, record
key and idempotency key from the events ``serve`` makes of the same frame, with the same code and
the same opening (mysql/txevents.py, postgres/frames.py), so they agree. Were they ever not to (a
bug in keeping the two sides alike), the first change of every frame, checked against ``serve``'s
own making, finds it: that source then stops asking for them, and the frame's events go on
without, the sinks making their own. No change is lost either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from deltaforge.envelopes import encode, native, row_key
from deltaforge.events import Event, Made, with_images

log = structlog.get_logger()


def agree(source: str, events: list[Event]) -> bool:
    """Whether the first record made by the child among ``events`` is what ``serve`` makes for
    its event: envelope, key and idempotency key; if not, an error says which event and part (the
    caller stops asking for them and takes :func:`without_made`)."""
    for e in events:
        if e.made is not None:
            envelope, key, idempotency = e.made
            wrong = [name for name, ok in (("envelope", envelope == encode(native(e))), ("key", key == row_key(e)),
                                           ("idempotency_key", idempotency == e.idempotency_key.encode())) if not ok]  # fmt: skip
            if not wrong:
                return True
            log.error(
                "child_envelope_mismatch", source=source, table=e.source.table, event_id=e.event_id, parts=wrong,
                reason="the decoder child made a record other than serve's own for this change (a bug): "
                "serve makes every record itself from now on",
            )  # fmt: skip
            return False
    return True


def without_made(events: list[Event]) -> list[Event]:
    """The same events with nothing made elsewhere: the sinks make their own."""
    return [with_images(e, e.op, e.before, e.after) for e in events]


class ChildRecords:
    """A source's side of the records its decoder child makes: whether to ask for them (``ok``:
    until one disagrees), and each ``txs`` frame's events with them, checked."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.ok = True

    def events(
        self, frame: tuple[Any, ...], make: Callable[[list[Any], list[Made | None] | None], list[Event]]
    ) -> list[Event]:
        """The events ``make`` makes of the frame's transactions, with what the child made (the
        frame's third item) when it agrees with ``serve``'s own making; without, from then on."""
        made = frame[2] if len(frame) > 2 and self.ok else None
        events = make(frame[1], made)
        if made is not None and not agree(self.source, events):
            self.ok = False  # not again in this process: serve makes every record
            return without_made(events)
        return events
