"""The source and every sink's server unreachable together for a few seconds, again and again,
under writes, ``serve`` never restarted. Each outage gives up connections and clients and each
recovery makes them again: what the last recovery leaves running must be what the first did.
librdkafka clients given up in an outage kept running (their threads, pipes and sockets, and
reconnecting) until the cyclic collector came, one or two more after each outage
(``actors/threads.py``: ``let_go``)."""

from __future__ import annotations

import time

import psutil

from chaos.runner import RunContext
from chaos.scenarios.rig import PIPELINE, Rig, postgres_rig, wait_for
from tests.helpers import librdkafka_clients

SLACK = 2
"""Open files and threads that come and go (a connection being made, a worker thread idling)."""


def resources(pid: int) -> dict[str, int]:
    """``serve``'s and its children's open files, threads and memory; its librdkafka clients
    (each runs one thread named ``rdk:main``)."""
    top = psutil.Process(pid)
    procs = [top, *top.children(recursive=True)]
    return {
        "files": sum(p.num_fds() for p in procs),
        "threads": sum(p.num_threads() for p in procs),
        "librdkafka clients": librdkafka_clients(pid),
        "rss_mb": round(sum(p.memory_info().rss for p in procs) / 2**20),
    }


def kafka_batches(rig: Rig) -> int:
    """Batches the Kafka sink has delivered (the pipeline's counters)."""
    assert rig.serve is not None
    return int(rig.serve.get(f"/pipelines/{PIPELINE}").json()["counters"]["sinks"]["kafka"]["batches"])


def recovered(rig: Rig, held: int) -> dict[str, int]:
    """Once changes flow again, the Kafka sink has delivered a batch past the ``held`` it had
    delivered by the outage's end, and every part is healthy: what ``serve`` runs. The Kafka sink
    gives up its partition-ends reader in an outage and makes another before its first batch
    after it (``deltaforge/sinks/kafka_ends.py``): measured before that batch, the first recovery
    counted one client fewer than every later one, and a run was failed for a client it had
    always had (seed 3206)."""
    rig.progress(len(rig.delivered()))
    wait_for(lambda: kafka_batches(rig) > held, 60, "the Kafka sink delivering again")
    wait_for(lambda: rig.health().get("status") == "ok", 60, "/health ok")
    assert rig.serve is not None
    return resources(rig.serve.proc.pid)


def settled(pid: int, first: dict[str, int], within: float = 20.0) -> dict[str, int]:
    """What ``serve`` runs, the least of each over ``within`` seconds or until none is above what
    ``first`` says: a client made for a moment (a reading of partition ends on a new client
    while the one before is still being destroyed) is not one left behind."""
    least = resources(pid)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not (
        least["librdkafka clients"] <= first["librdkafka clients"]
        and all(least[what] <= first[what] + SLACK for what in ("files", "threads"))
    ):
        time.sleep(0.5)  # the next look: a leftover never goes, a passing client does
        now = resources(pid)
        least = {what: min(least[what], now[what]) for what in least}
    return least


def run(ctx: RunContext) -> None:
    rounds = 8 if ctx.duration is None else max(3, int(ctx.duration // 12))
    with postgres_rig(ctx) as rig:
        sinks = [rig.add_kafka(), rig.add_nats(), rig.add_redis(exactly_once=True), rig.add_postgres_target()]
        rig.start()
        rig.workload.start()
        proxies = [rig.source_proxy, *(s.proxy for s in sinks if s.proxy is not None)]
        seen = []
        for _ in range(rounds):
            for proxy in proxies:
                proxy.disable()
            wait_for(rig.degraded, 60, "/health degraded")
            time.sleep(4)  # the outage itself
            for proxy in proxies:
                proxy.enable()
            seen.append(recovered(rig, kafka_batches(rig)))
        first = seen[0]
        assert rig.serve is not None
        last = settled(rig.serve.proc.pid, first)
        ctx.figures["rounds"] = rounds
        ctx.figures["librdkafka clients after each recovery"] = str([s["librdkafka clients"] for s in seen])
        ctx.figures["after the first recovery"] = str(first)
        ctx.figures["after the last"] = str(last)
        ctx.expect(
            "librdkafka clients more than after the first recovery",
            last["librdkafka clients"] - first["librdkafka clients"], 0,
        )  # fmt: skip
        for what in ("files", "threads"):
            ctx.expect(f"{what} more than after the first recovery (beyond {SLACK})",
                       max(0, last[what] - first[what] - SLACK), 0)  # fmt: skip
        rig.verify()
