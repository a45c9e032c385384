"""Restart intensity: how many restarts a supervisor allows in a window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Intensity:
    """At most ``max_restarts`` restarts within any ``within_seconds`` window."""

    max_restarts: int = 3
    within_seconds: float = 5.0


class RestartIntensity:
    """Sliding-window restart counter (OTP's MaxR/MaxT)."""

    def __init__(self, limit: Intensity) -> None:
        self.limit = limit
        self._times: deque[float] = deque()

    def record(self, now: float) -> bool:
        """Count one restart at ``now``; False when this one exceeds the limit."""
        self._times.append(now)
        horizon = now - self.limit.within_seconds
        while self._times and self._times[0] <= horizon:
            self._times.popleft()
        return len(self._times) <= self.limit.max_restarts

    @property
    def recent(self) -> int:
        """Restarts counted in the current window (for backoff)."""
        return len(self._times)
