"""Garbage-collector settings for a process that moves many short-lived events.

Every event brings a few dicts; with the default threshold (700 allocations)
the cyclic collector runs thousands of times per second and rescans the live
batches each time. CDC events hold no reference cycles (and the hot path
makes none: tests/test_reference_cycles.py), so collecting less often costs
little memory and measured +11 % pipeline throughput
(benchmarks/mysql_backlog.py, narrow table). ``gc.freeze()`` moves everything
loaded at start-up out of the collector's sight for good.
"""

from __future__ import annotations

import gc

from deltaforge import malloctune


def tune() -> None:
    """Freeze start-up objects and collect the young generation less often; and keep the heap
    a batch frees for the next one (:mod:`deltaforge.malloctune`)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    malloctune.keep_freed_heap()


def freeze_loaded() -> None:
    """Out of the collector's sight, what a large late import brought (the Spark session's
    pyspark, py4j, pyarrow and pandas objects): full collections then no longer rescan them."""
    gc.freeze()
