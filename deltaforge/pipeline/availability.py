"""What a pipeline is waiting for: its source or sinks while they are down.

Unavailable is not crashed: the actor that cannot reach its server says so here,
keeps retrying under its supervisor, and says so again when the server is back.
``/health`` reports the pipeline ``degraded`` while anything is listed, and
``/ready`` answers 503.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict

import structlog


class OutageView(TypedDict):
    """One outage as the API shows it."""

    since: str
    for_s: float
    last_error: str
    attempts: int


@dataclass
class Outage:
    since: float
    last_error: str
    attempts: int = 1


class Availability:
    """Outages of one pipeline by what is down (``source``, ``sink:<id>``)."""

    def __init__(self, pipeline: str = "pipeline") -> None:
        self._down: dict[str, Outage] = {}
        self._failing: dict[str, set[object]] = {}
        """Who is still failing, for what several callers reach (the state store's writers)."""
        self.log = structlog.get_logger().bind(pipeline=pipeline, actor="Availability")

    def down(self, what: str, error: BaseException | str, by: object | None = None) -> None:
        """``what`` failed to respond (again); the first call starts its outage. ``by``: the
        caller, when several reach ``what`` (see :meth:`up`)."""
        if by is not None:
            self._failing.setdefault(what, set()).add(by)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        outage = self._down.get(what)
        if outage is None:
            self._down[what] = Outage(time.time(), text)
            self.log.warning("unavailable", what=what, reason=text)
        else:
            outage.last_error = text
            outage.attempts += 1

    def listed(self, what: str) -> bool:
        """Whether ``what`` is down now."""
        return what in self._down

    def up(self, what: str, by: object | None = None) -> None:
        """``what`` responds again; to ``by``, that is: while another caller that reported it down
        still fails, the outage goes on (one writer's success is not the store's recovery)."""
        self.forget(what, by)
        if self._failing.get(what):
            return
        outage = self._down.pop(what, None)
        if outage is not None:
            self.log.info(
                "available_again",
                what=what,
                down_s=round(time.time() - outage.since, 3),
                attempts=outage.attempts,
            )

    def forget(self, what: str, by: object | None) -> None:
        """``by`` stopped trying (cancelled): the outage stays until someone reaches ``what``."""
        failing = self._failing.get(what)
        if failing is not None:
            failing.discard(by)
            if not failing:
                del self._failing[what]

    @property
    def degraded(self) -> bool:
        return bool(self._down)

    def view(self) -> dict[str, OutageView]:
        now = time.time()
        return {
            what: {
                "since": datetime.fromtimestamp(o.since, UTC).isoformat(timespec="seconds"),
                "for_s": round(now - o.since, 3),
                "last_error": o.last_error,
                "attempts": o.attempts,
            }
            for what, o in self._down.items()
        }
