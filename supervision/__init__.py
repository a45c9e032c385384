"""OTP-style supervision on asyncio/anyio, independent of CDC.

A :class:`Supervisor` starts its children in order, watches them, and when one
ends it consults the child's :class:`Restart` type and its own :class:`Strategy`:

* ``ONE_FOR_ONE`` restarts the failed child only;
* ``ONE_FOR_ALL`` stops every child and starts them all again;
* ``REST_FOR_ONE`` restarts the failed child and every child started after it.

Restarts are rate-limited by an :class:`Intensity` (``max_restarts`` within
``within_seconds``): one more fails the supervisor itself, which raises
:class:`SupervisorFailed` to its parent. A :class:`Fatal` error is never
restarted at any level: it stops the whole tree and keeps its reason.
"""

from supervision.backoff import Backoff
from supervision.child import Child, FunctionChild
from supervision.clock import Clock, FakeClock, MonotonicClock
from supervision.errors import Fatal, SupervisorFailed, Unavailable
from supervision.intensity import Intensity, RestartIntensity
from supervision.spec import ChildSpec, Restart, Strategy
from supervision.supervisor import Supervisor

__all__ = [
    "Backoff",
    "Child",
    "ChildSpec",
    "Clock",
    "FakeClock",
    "Fatal",
    "FunctionChild",
    "Intensity",
    "MonotonicClock",
    "Restart",
    "RestartIntensity",
    "Strategy",
    "Supervisor",
    "SupervisorFailed",
    "Unavailable",
]
