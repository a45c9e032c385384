"""Whether a Redis server refuses writes for want of memory, asked before a lagging sink comes back.

A Redis sink that lags (an optional one whose writes failed) is probed, and the source read again
for it once the probe answers (``pipeline/coordinator.py``). ``PING`` is answered by a server at
``maxmemory`` that refuses every write (``OOM command not allowed``): each such comeback failed
its first batch, and held the other sinks back while the source was read again, until the rule of
``pipeline/rereading.py`` spaced them out, so the sink came back tens of seconds after the server
had memory again. The probe now reads ``INFO memory`` as well: over ``maxmemory`` (less what Redis
does not count for eviction) under a policy that cannot free it (``noeviction``, or a
``volatile-*`` one with nothing left to evict), the sink is not back yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis import exceptions as rex


def refusal(memory: Mapping[str, Any]) -> str | None:
    """Why a server with this ``INFO memory`` refuses writes, or None.

    >>> refusal({"used_memory": 900_000, "maxmemory": 1, "maxmemory_policy": "noeviction"})
    'out of memory: used_memory 900000 over maxmemory 1 with maxmemory-policy noeviction: writes are refused (OOM)'
    >>> refusal({"used_memory": 900_000, "maxmemory": 0, "maxmemory_policy": "noeviction"}) is None
    True
    """
    limit = int(memory.get("maxmemory", 0) or 0)
    policy = str(memory.get("maxmemory_policy", ""))
    used = int(memory.get("used_memory", 0) or 0) - int(memory.get("mem_not_counted_for_evict", 0) or 0)
    if limit <= 0 or used <= limit or not (policy == "noeviction" or policy.startswith("volatile-")):
        return None
    return (
        f"out of memory: used_memory {used} over maxmemory {limit} with maxmemory-policy {policy}: "
        "writes are refused (OOM)"
    )


async def refuses_writes(client: Any) -> str | None:
    """:func:`refusal` of the server ``client`` talks to; None where its user may not ask
    (``NOPERM``: ``PING`` alone answers for it then)."""
    try:
        memory = await client.info("memory")
    except rex.ResponseError:
        return None
    return refusal(memory)
