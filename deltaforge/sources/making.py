"""In a decoder child: each change's Kafka record parts (``Event.made``), made beside its frame.

What ``serve`` does with them, and why they agree with its own: ``made.py``. Apart from it so that
a child imports no logging library (structlog took 100 ms of a child's CPU when its settings
arrived; the first event after a restart did not wait for it, docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

from deltaforge.envelopes import encoder, row_key
from deltaforge.events import Event, Made
from deltaforge.sources.childframes import write_frame


def maker() -> Callable[[Event], Made | None]:
    """What a decoder child makes of each event it sends: its native envelope, record key and
    idempotency key; None for a heartbeat, and for a change whose envelope or key cannot be
    encoded (the sink's own encoding then says why)."""
    envelope = encoder("native")

    def made_or_none(e: Event) -> Made | None:
        if e.op == "h":
            return None
        try:
            return envelope(e), row_key(e), e.idempotency_key.encode()
        except TypeError:  # a value JSON cannot hold (orjson's errors are TypeErrors)
            return None

    return made_or_none


def txs_sender(out: IO[bytes], events: Callable[[list[Any]], list[Event]]) -> Callable[[list[Any]], None]:
    """In a decoder child that makes records: what writes its ``txs`` frames, each change's
    record parts (:func:`maker`) beside the transactions, made from ``events``, the child's copy
    of ``serve``'s own making of a frame's events, from the same opening."""
    made_or_none = maker()

    def send(txs: list[Any]) -> None:
        write_frame(out, ("txs", txs, [made_or_none(e) for e in events(txs)]))

    return send
