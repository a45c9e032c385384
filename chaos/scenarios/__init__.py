"""Every chaos scenario, one module each; ``SCENARIOS`` is what ``python -m chaos list`` shows.

``quick`` scenarios form the CI subset: at least one per toxic type, each within a minute.
A scenario whose feature lands in another issue is listed as pending, by name (none now).
"""

from __future__ import annotations

from chaos.runner import Scenario
from chaos.scenarios import (
    backlog_drain,
    binlog_purge,
    crash_recovery,
    cut_mid_stream,
    dlq_poison,
    exactly_once,
    failover,
    half_open,
    kafka_source_outage,
    network_partition,
    pg_failover,
    reset_mid_batch,
    schema_drift,
    sink_outage,
    sliced_protocol,
    slot_dropped,
    slow_sink,
    snapshot_outage,
    soak,
    source_latency,
)

SCENARIOS: list[Scenario] = [
    Scenario("network_partition", "source proxy disabled 10 s, 3 rounds",
             "degraded meanwhile; lost 0; order 0; recovers by itself", network_partition.run, quick=True,
             toxics=("down",)),
    Scenario("source_latency", "latency 300 ± 100 ms both ways on the source",
             "progress under latency; lost 0; order 0", source_latency.run, quick=True, toxics=("latency",)),
    Scenario("sink_outage", "Kafka, NATS, Redis (exactly_once) and a PostgreSQL target down 20 s",
             "degraded; lost 0, order 0; Redis and NATS duplicates 0; target equals source", sink_outage.run, toxics=("down",)),
    Scenario("slow_sink", "bandwidth 20 KB/s + latency 50 ms on Redis",
             "backpressure: RSS < 400 MB, reader ≤ 3,000 events ahead; lost 0", slow_sink.run, quick=True,
             toxics=("bandwidth", "latency")),
    Scenario("half_open", "timeout toxic (hold) on Redis, both ways",
             "stall detected (degraded); lost 0; duplicates 0", half_open.run, quick=True, toxics=("timeout",)),
    Scenario("reset_mid_batch", "reset_peer on Redis and the PostgreSQL target, 3 rounds",
             "failed batches retried; lost 0; duplicates 0; target equals source", reset_mid_batch.run,
             quick=True, toxics=("reset_peer",)),
    Scenario("sliced_protocol", "slicer 32 ± 16 bytes on the source and Redis, both ways",
             "parsers cope; lost 0; duplicates 0", sliced_protocol.run, quick=True, toxics=("slicer",)),
    Scenario("cut_mid_stream", "limit_data 64 KB + slow_close on the source for 20 s",
             "every cut ridden through; lost 0; order 0", cut_mid_stream.run, quick=True,
             toxics=("limit_data", "slow_close")),
    Scenario("snapshot_outage", "source down 8 s, then cut every 256 KB, during an initial snapshot under writes",
             "degraded meanwhile; replay equals the table; the snapshot resumes, not restarts", snapshot_outage.run,
             quick=True, toxics=("down", "limit_data")),
    Scenario("kafka_source_outage", "a Kafka source's broker down 10 s under a steady producer",
             "degraded meanwhile; lost 0; per-partition order 0; recovers by itself", kafka_source_outage.run,
             quick=True, toxics=("down",)),
    Scenario("crash_recovery", "serve SIGKILLed 5 times at random moments",
             "lost 0; order 0; Redis duplicates 0", crash_recovery.run, toxics=("kill",)),
    Scenario("exactly_once", "SIGKILLs with Redis and Kafka exactly_once and a PostgreSQL if_newer target",
             "Redis duplicates 0; Kafka lost 0, order 0; target equals source", exactly_once.run, toxics=("kill",)),
    Scenario("schema_drift", "ALTER TABLE ADD COLUMN mid-stream",
             "lost 0; later events carry the column", schema_drift.run),
    Scenario("slot_dropped", "PostgreSQL slot dropped while serve is stopped",
             "halts: position lost … Re-snapshot required.; /health 503", slot_dropped.run),
    Scenario("binlog_purge", "MariaDB binlogs purged past the checkpoint while stopped",
             "halts: position lost … Re-snapshot required.; /health 503", binlog_purge.run),
    Scenario("backlog_drain", "source down 15 s under 300 tx/s, then back",
             "backlog drains; lost 0; drain rate reported", backlog_drain.run, toxics=("down",)),
    Scenario("soak", "a random fault every 1-3 s for --duration (60 s)",
             "lost 0; order 0; Redis duplicates 0; recovers", soak.run,
             toxics=("down", "latency", "reset_peer", "kill")),
    Scenario("dlq_poison", "the PostgreSQL target refuses some row versions (CHECK), then is fixed",
             "refused changes in the DLQ with coordinates; replayed over REST; target equals source",
             dlq_poison.run),
    Scenario("failover", "MariaDB primary replaced by its promoted GTID replica behind the same address",
             "reconciled as reachable; lost 0, order 0 across the switch", failover.run, toxics=("down",)),
    Scenario("pg_failover", "PostgreSQL primary replaced by its promoted standby behind the same address",
             "reconciled as reachable; lost 0, order 0 across the switch", pg_failover.run, toxics=("down",)),
]  # fmt: skip

BY_NAME = {s.name: s for s in SCENARIOS}
