"""deltaforge's benchmarks: ``python -m benchmarks`` runs them all (``--quick`` for CI).

Each module also runs alone (``python benchmarks/latency.py``). Figures are printed and
written as JSON, never asserted: timing goals belong here, not in tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One measured figure: ``name`` (what), ``value`` in ``unit``, and what it is compared with."""

    group: str
    name: str
    value: float
    unit: str
    note: str = ""
    target: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile of ascending ``sorted_values``, nearest rank: the value below which
    ``p`` % of them fall. Of 50 values the 99th is the largest; it takes 200 before it is not."""
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]
