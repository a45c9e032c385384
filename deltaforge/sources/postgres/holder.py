"""Who holds a replication slot: another reader, said and waited for, or the walsender of this
source's own stream from before, ended.

A slot has one walsender at a time. The one of a stream that stopped exits once the server
notices its connection closed. A connection that went silent for good (the client's host
vanished, a NAT forgot it) is noticed only after ``wal_sender_timeout`` (a minute by default;
never with 0), and until then its walsender holds the slot: the source, connecting again over a
new connection, was refused the slot for that long, or for ever. The decoder reports the
walsender of each stream it starts; at the next opening, the same walsender (its pid and its
start, since a pid alone may be another backend's by then) still holding the slot is one nothing
reads through, and is ended (``slot.end_stale``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

HOLDER = (
    "SELECT s.active_pid, a.application_name, a.client_addr::text, a.backend_start::text "
    "FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = {}"
)
"""The walsender holding a slot, as far as the server says (``{}``: the parameter's mark)."""

Walsender = tuple[int, str]
"""A walsender's pid and start (``backend_start`` as the server writes it)."""

Rows = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]


def walsender(slot: str, rows: Rows) -> Walsender | None:
    """The walsender holding ``slot`` now (right after a stream started: its own)."""
    found = rows(HOLDER.format("%s"), (slot,))
    if not found or found[0][0] is None or found[0][3] is None:
        return None
    return int(found[0][0]), str(found[0][3])


def busy(slot: str, rows: Rows) -> str:
    """Why the stream cannot start: the slot in use, by whom (as far as the server says)."""
    try:
        found = rows(HOLDER.format("%s"), (slot,))
    except Exception:  # noqa: BLE001 - who holds it is a courtesy; that it is held is the news
        found = []
    pid, app, addr, since = found[0] if found else (None, None, None, None)
    who = f"pid {pid}" if pid is not None else "another connection"
    seen = ", ".join(x for x in (f"application {app!r}" if app else "", f"from {addr}" if addr else "",
                                  f"since {since}" if since else "") if x)  # fmt: skip
    return (
        f"replication slot {slot!r} is in use by {who}{f' ({seen})' if seen else ''}: another pipeline "
        "given the same slot, or another consumer of it; a slot has one reader. Waiting for it to be "
        "free; if it is another pipeline's, give this source a slot of its own (spec.source.config.slot, "
        "and spec.source.config.publication)"
    )
