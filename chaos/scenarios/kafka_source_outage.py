"""A Kafka source's broker unreachable for 10 s (proxy disabled) while a producer keeps writing
through it: degraded meanwhile, recovered by itself, every acknowledged record in the file, each
partition in offset order, and the group's committed offsets no further than the file holds."""

from __future__ import annotations

import threading
import time
from itertools import pairwise
from typing import Any

from chaos.harness import port_of
from chaos.runner import RunContext
from chaos.scenarios.rig import wait_for
from tests.helpers import jsonl, offsets_in_order
from tests.serve_proc import Serve, free_port
from tests.servers.tansu import Tansu

TOPIC, PARTS = "orders", 3


class Writer(threading.Thread):
    """Numbered records, round robin over the partitions; counts what the broker acknowledged."""

    def __init__(self, brokers: str) -> None:
        super().__init__(daemon=True)
        self.brokers = brokers
        self.acked: set[tuple[int, int]] = set()  # (partition, number)
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.brokers, "enable.idempotence": True, "linger.ms": 5,
                      "message.timeout.ms": 300_000, "log_level": 0})  # fmt: skip

        def done(err: Any, msg: Any) -> None:
            if err is None:
                self.acked.add((msg.partition(), int(msg.value())))
            else:
                self.error = str(err)

        n = 0
        while not self.stop.is_set():
            for _ in range(50):
                p.produce(TOPIC, b"%d" % n, partition=n % PARTS, on_delivery=done)
                n += 1
            p.poll(0)
            self.stop.wait(0.05)  # about 1,000 records a second
        p.flush(120)


def held(path: Any) -> list[dict[str, Any]]:
    return [line["after"] for line in jsonl(path)] if path.exists() else []


def run(ctx: RunContext) -> None:
    port = free_port()
    proxy = ctx.proxies.proxy("kafka-source", f"127.0.0.1:{port}")
    brokers = f"127.0.0.1:{port_of(proxy)}"
    out = ctx.workdir / "events.jsonl"
    with Tansu(port=port, advertise=port_of(proxy)) as server:
        server.create_topic(TOPIC, partitions=PARTS)
        cfg = ctx.pipeline("chaos", {
            "source": {"type": "kafka", "config": {"id": "k", "brokers": brokers, "topics": [TOPIC],
                                                   "group_id": "chaos", "format": "raw"}},
            "sinks": [{"type": "file", "config": {"id": "file", "path": str(out)}}],
            "batch": {"max_events": 500, "max_ms": 50},
            "storage": {"type": "sqlite", "path": str(ctx.workdir / "checkpoints.db")},
        })  # fmt: skip
        writer = Writer(brokers)
        serve = Serve(ctx.workdir, "--config", str(cfg), "--log-file", str(ctx.workdir / "log.jsonl"))
        try:
            serve.wait_api()
            writer.start()
            wait_for(lambda: len(held(out)) > 2000, 60, "2000 records delivered")
            proxy.disable()
            ctx.figures["degraded_after_s"] = round(
                wait_for(
                    lambda: serve.get("/health").json().get("status") == "degraded", 60, "/health degraded"
                ),
                1,
            )
            time.sleep(10)  # the outage itself
            proxy.enable()
            wait_for(lambda: len(held(out)) > len(writer.acked) // 2 + 1000, 120, "delivery going on")
            writer.stop.set()
            writer.join(150)
            want = set(writer.acked)
            took = wait_for(lambda: want <= {(r["partition"], int(r["value"])) for r in held(out)}, 120,
                            "every acknowledged record in the file")  # fmt: skip
            ctx.figures["caught_up_s"] = round(took, 1)
            rows = held(out)
            got = {(r["partition"], int(r["value"])) for r in rows}
            ctx.figures["records"] = len(want)
            ctx.expect("records lost", len(want - got), 0)
            ctx.expect("producer errors", writer.error, None)
            disorder = 0
            for part in range(PARTS):
                firsts = offsets_in_order(rows, part)
                disorder += sum(1 for a, b in pairwise(firsts) if b < a)
            ctx.expect("per-partition order violations", disorder, 0)
            wait_for(lambda: serve.get("/health").json().get("status") == "ok", 60, "/health ok")
            ctx.expect("serve exit code", serve.terminate(), 0)
        finally:
            writer.stop.set()
            if serve.proc.poll() is None:
                serve.kill()
