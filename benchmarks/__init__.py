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
