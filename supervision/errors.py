"""Errors with a meaning for supervisors."""

from __future__ import annotations


class Fatal(Exception):
    """An error that no restart can fix: position lost, producer fenced, auth revoked.

    Raised anywhere in a tree, it is never restarted: every supervisor above it
    stops its children and re-raises, so the whole tree stops and the reason is
    kept in each snapshot on the way up.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Unavailable(Exception):
    """Something a child needs is down (a database restarting, a broker unreachable).

    Not a crash: the supervisor restarts the child with capped exponential backoff
    and jitter for as long as it takes (or up to its ``max_unavailable``), and these
    restarts do not count towards restart intensity.
    """


class SupervisorFailed(Exception):
    """A supervisor exceeded its restart intensity and gave up (escalation).

    Raised ``from`` the last failure, so its traceback travels with it.
    """

    def __init__(
        self,
        supervisor: str,
        child: str,
        cause: BaseException | None,
        gave_up: str = "exceeded its restart intensity",
    ) -> None:
        why = f"{type(cause).__name__}: {cause}" if cause is not None else "normal exit"
        super().__init__(f"supervisor {supervisor!r} {gave_up}; last failure in {child!r}: {why}")
        self.supervisor = supervisor
        self.child = child
        self.cause = cause
