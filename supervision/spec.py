"""Child specs, restart types and strategies."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from supervision.child import Child


class Restart(enum.Enum):
    """When a child that ended is started again."""

    PERMANENT = "permanent"  # always
    TRANSIENT = "transient"  # only after a failure, not after a normal exit
    TEMPORARY = "temporary"  # never


class Strategy(enum.Enum):
    """Which children restart when one of them must."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How a supervisor runs one child."""

    child: Child
    restart: Restart = Restart.PERMANENT
    shutdown_timeout: float = 5.0

    @property
    def name(self) -> str:
        return self.child.name
