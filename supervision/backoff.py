"""Exponential backoff with jitter between restarts."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the n-th restart in a row: ``base * 2**(n-1)`` capped at ``max``.

    "Equal jitter": the delay is drawn from ``[cap/2, cap]`` so that children that
    failed together do not all come back in the same instant, while the delay still
    grows with every attempt.
    """

    base: float = 0.1
    max: float = 10.0

    def cap(self, attempt: int) -> float:
        if attempt <= 0 or self.base <= 0:
            return 0.0
        return float(min(self.max, self.base * 2.0 ** min(attempt - 1, 62)))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        cap = self.cap(attempt)
        r = (rng or random).random()
        return cap / 2 + r * cap / 2
