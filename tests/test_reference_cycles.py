"""The hot path makes no reference cycles: garbage that only the cyclic collector frees is freed
in pauses (10-37 ms each, every few seconds at 5k rows/s), and those pauses were the latency
benchmark's p99. Each test counts what a full collection finds after a run with the collector off."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

from pymysqlreplication.event import XidEvent
from pymysqlreplication.row_event import TableMapEvent, WriteRowsEvent

from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.mysql.binlog import each_once
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc
from tests.mysql_kit import binlog_reader, fresh_db
from tests.servers.mariadb import MariaDB

TRANSACTIONS = 300


def cyclic_garbage(run: Any) -> int:
    """Objects a full collection frees after ``run()``, the collector off meanwhile."""
    gc.collect()
    gc.disable()
    try:
        run()
        return gc.collect()
    finally:
        gc.enable()


def test_the_binlog_decoder_frees_each_event_by_reference_counting(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8))")
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
        for i in range(TRANSACTIONS):
            cur.execute("INSERT INTO t VALUES (%s, 'x')", (i,))

    def read(events: Iterator[Any]) -> None:
        rows = 0
        for ev in events:
            if isinstance(ev, WriteRowsEvent):
                rows += len(ev.rows)
        assert rows == TRANSACTIONS

    events = [WriteRowsEvent, XidEvent, TableMapEvent]
    plain = binlog_reader(mariadb, file, pos, events)
    cut = binlog_reader(mariadb, file, pos, events)
    try:
        # The premise: pymysqlreplication's events and their packets refer to each other.
        assert cyclic_garbage(lambda: read(iter(plain))) > 10 * TRANSACTIONS
        assert cyclic_garbage(lambda: read(each_once(cut))) < TRANSACTIONS // 10
    finally:
        plain.close()
        cut.close()


async def test_delivering_a_batch_leaves_no_cyclic_garbage() -> None:
    """Batch by batch through the pipeline's actors (a synthetic source, a sink that keeps
    nothing): what is left for the collector does not grow with the number of batches."""
    total = 3000
    sink = ScriptedSink("a")
    runner = PipelineRunner(
        config(sinks=[sink_doc("a")], batch={"max_events": 10}),
        store=MemoryCheckpointStore(),
        sinks={"a": sink},
        source=SyntheticSource(total, chunk=10),
    )
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: runner.ctx.stats.events_committed >= 100, what="the pipeline warmed up")
        gc.collect()
        gc.disable()
        try:
            done = runner.ctx.stats.batches_committed
            await wait_until(lambda: runner.ctx.stats.events_committed == total, what="every batch")
            batches = runner.ctx.stats.batches_committed - done
            found = gc.collect()
        finally:
            gc.enable()
    finally:
        await runner.drain()
        await asyncio.wait_for(task, 10)
    assert batches >= 200
    assert found < batches, f"{found} objects in cycles after {batches} batches"
