"""A library saying the same thing again and again is said once a minute, with a count.

librdkafka logs a ``FAIL`` line at every reconnect to a broker that is down or whose name does not
resolve: three to five a second for as long as the outage lasts, bursts of a hundred when a
producer is made anew. On 5 Dec a 20-second Kafka outage of the chaos suite left 188 such lines
in a log of 202, and an hour's outage would leave some fifteen thousand, burying what deltaforge
itself says (``unavailable``, ``available_again``) under a library's retries.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

WINDOW_S = 60.0
"""How long the repeats of a line are counted instead of logged."""

MOST_KINDS = 1_000
"""Kinds of line remembered at once; past it the longest unseen are forgotten (said again)."""

_NUMBERS = re.compile(r"\d+")


class Repeats:
    """Which library lines to log: the first of a kind, then none of its repeats for ``window_s``,
    then the next one with how many were held back. A kind is the library's logger, the level
    and the message with its numbers taken out: repeats differ in a port, a producer's number,
    ``after 3ms``. Lines come from several threads (a sink's, the event loop, a decoder's relay).
    Repeats that no later line reports (the outage ended within the minute) are :meth:`overdue`.

    >>> clock = iter([0.0, 1.0, 2.0, 61.0]).__next__
    >>> r = Repeats(60.0, clock)
    >>> [r.admit("librdkafka", "error", f"Connect to :{p} failed") for p in (9092, 9093, 9094, 9095)]
    [0, None, None, 2]
    """

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._kinds: dict[tuple[str, str, str], tuple[float, int, str]] = {}
        """Each kind's last logged time, the repeats held back since and the last of them, oldest
        seen first."""
        self._lock = threading.Lock()

    def admit(self, logger: str, level: str, message: str) -> int | None:
        """``None``: hold this line back. Otherwise log it, saying the count returned: how many
        lines of its kind were held back since the last one logged (0: none)."""
        kind = (logger, level, without_numbers(message))
        now = self.clock()
        with self._lock:
            seen = self._kinds.pop(kind, None)
            if seen is not None and now - seen[0] < self.window_s:
                self._kinds[kind] = (seen[0], seen[1] + 1, message)
                return None
            self._kinds[kind] = (now, 0, "")
            if len(self._kinds) > MOST_KINDS:
                del self._kinds[next(iter(self._kinds))]
            return 0 if seen is None else seen[1]

    def overdue(self, everything: bool = False) -> list[tuple[str, str, str, int]]:
        """The kinds whose lines held back no later line has reported, once their minute is over
        (``everything``: now, as the process ends): each as its logger, level, last line held
        back, and how many were (that one included). Each counts as logged now: its repeats
        from here on are held back for another minute, as after a line logged.

        >>> clock = iter([0.0, 1.0, 30.0, 60.0]).__next__
        >>> r = Repeats(60.0, clock)
        >>> r.admit("librdkafka", "error", "Connect to :9092 failed"), r.admit("librdkafka", "error", "Connect to :9093 failed")
        (0, None)
        >>> r.overdue(), r.overdue()
        ([], [('librdkafka', 'error', 'Connect to :9093 failed', 1)])
        """
        now = self.clock()
        due = []
        with self._lock:
            for kind, (at, held, last) in list(self._kinds.items()):
                if held and (everything or now - at >= self.window_s):
                    due.append((kind[0], kind[1], last, held))
                    self._kinds[kind] = (now, 0, "")
        return due

    def forget(self) -> None:
        """Remember no line: each is logged at its next saying."""
        with self._lock:
            self._kinds.clear()


LIBRARIES = Repeats()
"""The process's one: library lines logged by ``logsetup`` and relayed from decoder children."""


def without_numbers(message: str) -> str:
    """What makes lines one kind: their words, numbers taken out (a port, ``after 3ms``)."""
    return _NUMBERS.sub("N", message)


def say_overdue(log: Any, everything: bool = False) -> None:
    """Log the repeats :data:`LIBRARIES` holds back that no later line will report
    (:meth:`Repeats.overdue`): the last of each kind, with ``repeated``."""
    for actor, level, message, held in LIBRARIES.overdue(everything):
        say = log.error if level == "error" else log.warning
        say(f"library_{level}", actor=actor, message=message, repeated=held)


def log_library_line(log: Any, actor: str, error: bool, **fields: Any) -> None:
    """A library's line (``fields`` holds its ``message``) as ``library_error`` or
    ``library_warning`` with ``actor``, unless :data:`LIBRARIES` holds it back as a repeat."""
    held = LIBRARIES.admit(actor, "error" if error else "warning", str(fields.get("message")))
    if held is None:
        return
    if held:
        fields["repeated"] = held
    say = log.error if error else log.warning
    say("library_error" if error else "library_warning", actor=actor, **fields)
