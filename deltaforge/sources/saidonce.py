"""The failures of a check a source runs every few seconds beside its reading, said once each."""

from __future__ import annotations


class SaidOnce:
    """The last failure a periodic check said: each distinct error is said once (every few
    seconds would drown the log), and again once the check has gone through in between."""

    def __init__(self) -> None:
        self.last: str | None = None

    def new(self, exc: BaseException) -> str | None:
        """``exc`` as ``Type: message`` when it is not the failure said last, else None."""
        error = f"{type(exc).__name__}: {exc}"
        if error == self.last:
            return None
        self.last = error
        return error

    def through(self) -> None:
        """The check went through: its next failure is said."""
        self.last = None
