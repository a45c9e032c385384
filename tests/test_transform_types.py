"""Row images as typed Arrow, and back: the conversion alone, then through Spark from real sources.

The first tests need no Spark: they pin down how events become Arrow tables and
how a job's result becomes events again. The last two read real MariaDB and
PostgreSQL changes (every column type the source tests cover), send them
through a Spark filter that compares typed values, and check that what comes
back equals what went in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import gc
import hashlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import asyncpg
import pyarrow as pa
import pytest

from deltaforge.config import ConfigError, parse_pipeline
from deltaforge.events import Event, SourceInfo, new_event, new_source_info, with_images
from deltaforge.pipeline.messages import Batch
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from deltaforge.transform.arrow import (
    TableSchema,
    TransformError,
    from_arrow,
    group_by_table,
    merge_in_order,
    to_arrow,
)
from deltaforge.transform.changes import Changes
from deltaforge.transform.plan import Plan, ProcessorError, Transformed
from deltaforge.transform.rowtypes import mysql_type, postgres_type, sqlite_type, table_schema
from deltaforge.transform.session import SparkRuntime, runtime_for
from deltaforge.transform.spec import ProcessorSpec, SparkConfig
from tests import postgres_kit as pg
from tests import test_mysql_source as my
from tests.helpers import first_occurrences
from tests.kit import ScriptedSink, SeqPosition, SyntheticSource, doc
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres


def event(seq: int, table: str, after: dict[str, Any] | None, op: str = "c", before: Any = None) -> Event:
    pos = SeqPosition(seq)
    return Event(
        op, before, after, SourceInfo("x", "db", table, pos, 0), "1", True, str(seq), (seq,), pos, "t", 10
    )


ORDERS = TableSchema(
    "db", "orders", (("id", pa.int64()), ("amount", pa.float64()), ("at", pa.timestamp("us")))
)


def test_declared_types_are_kept_even_when_values_look_otherwise() -> None:
    events = [
        event(0, "orders", {"id": 1, "amount": 5, "at": None}),
        event(1, "orders", {"id": 2, "amount": 7.5, "at": None}),
    ]
    sent = to_arrow(events, [0, 1], ORDERS)
    assert sent.image == ORDERS.struct  # 5 is a float64 because the column is REAL
    assert sent.table.column("after").to_pylist()[0] == {"id": 1, "amount": 5.0, "at": None}
    assert sent.table.column("_seq").to_pylist() == [0, 1] and sent.json == frozenset()


def test_values_that_do_not_fit_are_typed_from_themselves_never_dropped() -> None:
    events = [
        event(0, "orders", {"id": 1, "amount": "n/a", "at": None, "added": 3}),  # text in REAL, a new column
        event(1, "orders", {"id": 2, "amount": 1.5, "at": None, "added": None, "doc": {"k": [1, "two"]}}),
    ]
    sent = to_arrow(events, [0, 1], ORDERS)
    image = sent.image
    assert image.names == ["id", "amount", "at", "added", "doc"]
    assert image.field("added").type == pa.int64()
    # no single Arrow type holds both "n/a" and 1.5, nor a list of int and text: JSON text, decoded back
    assert sent.json == {"amount", "doc"}
    back = from_arrow(sent.table, events, sent, "p")
    assert [e for _, e in back] == [
        dataclasses.replace(events[0], after={**events[0].after, "doc": None}),  # type: ignore[dict-item]
        dataclasses.replace(events[1], after={**events[1].after}),  # type: ignore[dict-item]
    ]


def test_naive_timestamps_come_back_naive_after_spark_makes_them_utc() -> None:
    at = dt.datetime(2024, 1, 2, 3, 4, 5, 6)
    events = [event(0, "orders", {"id": 1, "amount": 1.0, "at": at})]
    sent = to_arrow(events, [0], ORDERS)
    # what Spark's toArrow() returns with spark.sql.session.timeZone=UTC
    utc = sent.table.set_column(
        5, "after", pa.array([{"id": 1, "amount": 1.0, "at": at.replace(tzinfo=dt.UTC)}],
                             pa.struct([("id", pa.int64()), ("amount", pa.float64()), ("at", pa.timestamp("us", "UTC"))])),
    )  # fmt: skip
    [(_, back)] = from_arrow(utc, events, sent, "p")
    assert back.after == {"id": 1, "amount": 1.0, "at": at}


def test_results_are_merged_in_source_order_and_may_not_invent_events() -> None:
    events = [event(i, "a" if i % 2 else "b", {"id": i}) for i in range(6)]
    heartbeat = dataclasses.replace(event(6, "-", None), op="h")
    groups, heartbeats = group_by_table([*events[:4], heartbeat, *events[4:]])
    assert groups == {("db", "b"): [0, 2, 5], ("db", "a"): [1, 3, 6]} and heartbeats == [4]
    merged = merge_in_order([[(i, events[i]) for i in (5, 1)], [(i, events[i]) for i in (4, 0)]])
    assert [(seq, e.order[0]) for seq, e in merged] == [(0, 0), (1, 1), (4, 4), (5, 5)]
    with pytest.raises(TransformError, match="came back twice"):
        merge_in_order([[(1, events[1])], [(1, events[1])]])
    sent = to_arrow(events, [0, 2], None)
    foreign = sent.table.set_column(0, "_seq", pa.array([0, 3], pa.int64()))
    with pytest.raises(TransformError, match=r"_seq \(3\) was not in the batch"):
        from_arrow(foreign, events, sent, "spec.processors[0]")


def test_a_job_over_several_batches_splits_back_into_them() -> None:
    events = [event(i, "a", {"id": i}) for i in range(8)]
    kept = [(0, events[0]), (2, events[2]), (3, events[3]), (7, events[7])]
    parts = Transformed(kept, 1, 0.0).split([3, 2, 3])
    assert parts == [[events[0], events[2]], [events[3]], [events[7]]]
    assert Transformed(kept[:1], 1, 0.0).split([1, 4]) == [[events[0]], []]


def test_a_batch_whose_events_were_all_dropped_still_moves_the_checkpoint() -> None:
    events = [event(1, "a", {"id": 1}), event(2, "a", {"id": 2})]
    batch = Batch(1, [events[0]], 10, last=events[1])
    assert batch.checkpoint.to_doc() == {"seq": 2} and batch.last_order == (2,)
    assert Batch(2, [], 0, last=events[1]).checkpoint.to_doc() == {"seq": 2}


def test_declared_sql_types_map_to_arrow() -> None:
    assert sqlite_type("INTEGER") == pa.int64() and sqlite_type("varchar(20)") == pa.string()
    assert sqlite_type("REAL") == pa.float64() and sqlite_type("BLOB") == pa.binary()
    assert mysql_type("int(11) unsigned") == pa.int64() and mysql_type(
        "bigint(20) unsigned"
    ) == pa.decimal128(20, 0)
    assert mysql_type("decimal(12,4)") == pa.decimal128(12, 4) and mysql_type("datetime(6)") == pa.timestamp(
        "us"
    )
    assert postgres_type("numeric(20,6)") == pa.decimal128(20, 6) and postgres_type("numeric") == pa.string()
    assert postgres_type("timestamp with time zone") == pa.timestamp("us", "UTC")
    assert postgres_type("timestamp(6) without time zone") == pa.timestamp("us")


def test_processor_config_errors_name_the_field() -> None:
    d = doc()
    d["spec"]["processors"] = [
        {"type": "filterr", "expr": "x"},
        {"type": "filter"},
        {"type": "mask", "columns": {"email": "scramble"}},
        {"type": "sql", "query": "SELECT * FROM batch", "tables": "orders"},
        {"type": "mask", "columns": {}, "extra": 1},
    ]
    d["spec"]["spark"] = {"master": "yarn", "threads": 0, "conf": {"spark.x": [1]}}
    with pytest.raises(ConfigError) as err:
        parse_pipeline(d, env={})
    text = str(err.value)
    for expected in (
        "spec.processors[0].type: expected one of filter, mask, sql, got 'filterr'",
        "spec.processors[1].expr: required",
        "spec.processors[2].columns.email: expected one of hash, redact, drop, got 'scramble'",
        "spec.processors[3].tables: expected a non-empty list of table names",
        "spec.processors[4].extra: unknown field",
        "spec.processors[4].columns: required",
        "spec.spark.master: expected local, local[N], local[*] or spark://host:port, got 'yarn'",
        "spec.spark.threads: expected an integer >= 1",
        "spec.spark.conf.spark.x: expected a string or number",
    ):
        assert expected in text
    d["spec"]["processors"] = [{"type": "filter", "expr": "op = 'c'", "tables": ["orders"]}]
    d["spec"]["spark"] = {
        "master": "spark://127.0.0.1:7077",
        "conf": {"spark.executor.memory": "1g", "x.y": 2},
    }
    cfg = parse_pipeline(d, env={})
    [p] = cfg.processors
    assert (p.type, p.path, p.expr, p.tables) == ("filter", "spec.processors[0]", "op = 'c'", ("orders",))
    assert cfg.spark.master == "spark://127.0.0.1:7077"
    assert tuple(cfg.spark.conf.items()) == (("spark.executor.memory", "1g"), ("x.y", "2"))


# -- through Spark, from real sources ---------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkRuntime]:
    runtime = runtime_for(SparkConfig(master="local[2]"), "tests")
    runtime.ensure()
    try:
        yield runtime
    finally:
        runtime.stop()


async def through_spark(runtime: SparkRuntime, plan: Plan, events: list[Event]) -> list[Event]:
    loop = asyncio.get_running_loop()
    runtime.ensure()
    await loop.run_in_executor(runtime.pool, plan.analyse, runtime)
    result = await loop.run_in_executor(runtime.pool, plan.run, runtime, events)
    return result.events


async def test_postgres_rows_keep_their_types_through_spark(postgres: Postgres, spark: SparkRuntime) -> None:
    db = await pg.fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(pg.TYPES)
    await conn.execute("ALTER TABLE types REPLICA IDENTITY FULL")
    src = pg.source(postgres, db, tables=["public.types"])
    await src.open(None)
    await conn.execute(
        "INSERT INTO types VALUES (1, 9007199254740993, 12345678901234.123456, -2.5e100, 'héllo', '\\x00ff10', "
        "true, '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.5+02', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, \"two\"]}', '{\"z\": null}', '{1,2,NULL}', "
        "'{\"a b\",c}', NULL)"
    )
    await conn.execute("INSERT INTO types (id, num, ok) VALUES (2, 5, true)")
    await conn.execute("UPDATE types SET txt = 'changed' WHERE id = 1")
    events = await pg.read_n(src, 3)
    declared = await src.describe_tables()
    await src.close()
    await conn.close()
    [schema] = [table_schema(t, "postgres") for t in declared]
    types = dict(schema.columns)
    assert (schema.db, schema.table) == ("public", "types")
    assert types["num"] == pa.decimal128(20, 6) and types["tstz"] == pa.timestamp("us", "UTC")
    assert schema.json == {"j", "jb"}
    # numeric compared as a number, boolean as a boolean, JSON with Spark's JSON functions
    plan = Plan(
        (
            ProcessorSpec(
                "filter",
                "p",
                expr="after.num > 100 AND after.ok AND get_json_object(after.j, '$.k[1]') = 'two'",
            ),
        ),
        [schema],
    )
    out = await through_spark(spark, plan, events)
    assert out == [events[0], events[2]]  # row 2 (num 5) filtered; the rest exactly as read
    # the same filter in a sql processor: whole rows make the round trip through Arrow and back
    query = f"SELECT * FROM batch WHERE {plan.processors[0].expr}"
    sql_plan = Plan((ProcessorSpec("sql", "p", query=query),), [schema])
    assert await through_spark(spark, sql_plan, events) == [events[0], events[2]]


async def test_mysql_rows_keep_their_types_through_spark(mariadb: MariaDB, spark: SparkRuntime) -> None:
    db = my.fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(my.TYPES_DDL.format(db=db))
    src = my.source(mariadb, [f"{db}.types"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            "INSERT INTO types VALUES (1, 9007199254740993, -5, 12345678.1234, 1.5, -2.25e100, 'héllo', "
            "'t', x'00ff10', '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.500', "
            "'{\"k\": 1}', 'green', 'a,c', NULL)"
        )
        cur.execute("INSERT INTO types (id, dec_) VALUES (2, 99.5)")
    events = await my.read_n(src, 2)
    declared = await src.describe_tables()
    await src.close()
    [schema] = [table_schema(t, "mysql") for t in declared]
    assert (schema.db, schema.table) == (db, "types")
    assert dict(schema.columns)["dec_"] == pa.decimal128(12, 4)
    plan = Plan(
        (ProcessorSpec("filter", "p", expr="after.dec_ > 100 AND after.dtm < timestamp'2025-01-01'"),),
        [schema],
    )
    # filters and masks change only what they mask: the rest stays exactly as read
    assert await through_spark(spark, plan, events) == [events[0]]
    # a sql processor returns whole rows, which make the round trip through Arrow and back
    query = f"SELECT * FROM batch WHERE {plan.processors[0].expr}"
    [out] = await through_spark(spark, Plan((ProcessorSpec("sql", "p", query=query),), [schema]), events)
    # a SET arrives as MySQL's text, as a snapshot reads it, and travels as a string
    assert out.after is not None and events[0].after is not None
    assert out.after["s"] == events[0].after["s"] == "a,c"
    assert out.after == events[0].after
    assert dataclasses.replace(out, after=None) == dataclasses.replace(events[0], after=None)
    assert out.after["dec_"] == Decimal("12345678.1234") and out.after["dtm"] == dt.datetime(
        2024, 1, 2, 3, 4, 5, 123456
    )
    # masks: Spark's hash and redaction replace just their columns; a dropped column is gone
    masks = (
        ProcessorSpec("mask", "p0", columns=(("vc", "hash"), ("s", "redact"), ("bl", "drop"))),
        ProcessorSpec("filter", "p1", expr="length(after.vc) = 64"),
    )
    masked = await through_spark(spark, Plan(masks, [schema]), events)
    assert [m.order for m in masked] == [events[0].order]  # row 2 has no vc: filtered after the hash
    [m] = masked
    assert m.after is not None and m.before is None
    expected = {k: v for k, v in events[0].after.items() if k != "bl"}
    expected |= {"vc": hashlib.sha256("héllo".encode()).hexdigest(), "s": "***"}
    assert m.after == expected  # every other column exactly as read (JSON, dates, decimals)


async def test_pipelines_analysed_at_the_same_time_do_not_see_each_others_tables(spark: SparkRuntime) -> None:
    orders = TableSchema("db", "orders", (("id", pa.int64()), ("amount", pa.float64())))
    customers = TableSchema("db", "customers", (("id", pa.int64()), ("name", pa.string())))
    bad = Plan((ProcessorSpec("filter", "spec.processors[0]", expr="after.amount > 1"),), [customers])
    good = Plan((ProcessorSpec("filter", "spec.processors[0]", expr="after.amount > 1"),), [orders])
    loop = asyncio.get_running_loop()
    for _ in range(15):
        results = await asyncio.gather(
            loop.run_in_executor(spark.pool, bad.analyse, spark),
            loop.run_in_executor(spark.pool, good.analyse, spark),
            return_exceptions=True,
        )
        assert isinstance(results[0], ProcessorError) and "FIELD_NOT_FOUND" in str(results[0])
        assert results[1] is None
        bad._compiled.clear()
        good._compiled.clear()


@pytest.mark.parametrize(
    "processor",
    [
        ProcessorSpec("filter", "p", expr="after.id % 2 = 0"),  # returns _seq only
        ProcessorSpec("sql", "p", query="SELECT * FROM batch WHERE after.id % 2 = 0"),  # whole rows
    ],
    ids=["filter", "sql"],
)
async def test_finished_jobs_do_not_pile_up_in_the_jvm_heap(
    spark: SparkRuntime, processor: ProcessorSpec
) -> None:
    """With serve's GC tuning, py4j's reference cycles would hold every job's data in the JVM."""
    schema = TableSchema("db", "t", (("id", pa.int64()), ("text", pa.string())))
    plan = Plan((processor,), [schema])
    events = [event(i, "t", {"id": i, "text": "x" * 200}) for i in range(5000)]
    jvm: Any = spark.ensure().sparkContext._jvm

    def heap_mb() -> int:
        runtime = jvm.java.lang.Runtime.getRuntime()
        jvm.java.lang.System.gc()
        return int((runtime.totalMemory() - runtime.freeMemory()) // 2**20)

    def jobs(n: int) -> None:
        for _ in range(n):
            assert len(plan.run(spark, events).kept) == 2500

    loop = asyncio.get_running_loop()
    saved = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)  # what deltaforge.gctune sets in serve
    try:
        await loop.run_in_executor(spark.pool, jobs, 30)
        before = heap_mb()
        await loop.run_in_executor(spark.pool, jobs, 80)  # ~1.2 MB of row data each
        after = heap_mb()
    finally:
        gc.set_threshold(*saved)
    assert after - before < 60, (before, after)  # py4j's cycles held it all: ~380 MB


def _sha(value: Any) -> str | None:
    return None if value is None else hashlib.sha256(str(value).encode()).hexdigest()


@pytest.mark.parametrize(
    ("processors", "keep", "mask", "rebuilds_images"),
    [
        (  # masks that end the chain are applied to the values read back alone
            (
                ProcessorSpec("filter", "p0", expr="after.id % 2 = 0"),
                ProcessorSpec("mask", "p1", columns=(("email", "hash"), ("card", "redact"))),
                ProcessorSpec("mask", "p2", columns=(("email", "hash"),)),
            ),
            lambda im: im["id"] % 2 == 0,
            lambda im: {**im, "email": _sha(_sha(im["email"])), "card": im["card"] and "***"},
            False,
        ),
        (  # a filter after a mask sees the masked value
            (
                ProcessorSpec("mask", "p0", columns=(("email", "hash"),)),
                ProcessorSpec("filter", "p1", expr="after.email = sha2('e4', 256) OR after.id = 3"),
            ),
            lambda im: im["id"] in (3, 4),
            lambda im: {**im, "email": _sha(im["email"])},
            True,
        ),
        (
            (
                ProcessorSpec("mask", "p0", columns=(("card", "drop"),)),
                ProcessorSpec("filter", "p1", expr="after.id > 2"),
                ProcessorSpec("mask", "p2", columns=(("email", "redact"),)),
            ),
            lambda im: im["id"] > 2,
            lambda im: {"id": im["id"], "email": im["email"] and "***"},
            True,
        ),
    ],
    ids=["filter-then-masks", "mask-then-filter", "drop-filter-redact"],
)
async def test_filter_and_mask_chains_mask_both_images_as_written(
    spark: SparkRuntime, processors: tuple[ProcessorSpec, ...], keep: Any, mask: Any, rebuilds_images: bool
) -> None:
    schema = TableSchema("db", "t", (("id", pa.int64()), ("email", pa.string()), ("card", pa.string())))
    events = [
        event(i, "t", {"id": i, "email": None if i == 5 else f"e{i}", "card": None if i == 2 else f"c{i}"},
              op="u" if i % 3 == 0 else "c", before={"id": i, "email": f"old{i}", "card": None} if i % 3 == 0 else None)
        for i in range(1, 9)
    ]  # fmt: skip
    plan = Plan(processors, [schema])
    out = await through_spark(spark, plan, events)
    kept = [e for e in events if keep(e.after)]
    assert [e.order for e in out] == [e.order for e in kept] and len(kept) >= 2
    for got, e in zip(out, kept, strict=True):
        assert got.after == mask(e.after)
        assert got.before == (None if e.before is None else mask(e.before))
    [compiled] = plan._compiled.values()
    assert ("named_struct" in compiled.steps[-1][1]) is rebuilds_images


@pytest.mark.parametrize(
    "processors",
    [
        (
            ProcessorSpec("filter", "p0", expr="after.id % 3 = 0"),
            ProcessorSpec("mask", "p1", columns=(("text", "hash"),)),
        ),
        (ProcessorSpec("sql", "p0", query="SELECT * FROM batch WHERE after.id % 3 = 0"),),
    ],
    ids=["filter+mask", "sql"],
)
async def test_each_batch_is_bound_to_its_views_without_a_sql_command_of_its_own(
    spark: SparkRuntime, processors: tuple[ProcessorSpec, ...]
) -> None:
    """After a key's first batch, a batch's views are rebound in the catalog (TempViews): each
    batch is one SQL execution, its job's, and every job sees its own batch, never the one before."""
    schema = TableSchema("db", "t", (("id", pa.int64()), ("text", pa.string())))
    plan = Plan(processors, [schema])
    jspark: Any = spark.ensure()._jsparkSession
    store, bus = jspark.sharedState().statusStore(), jspark.sparkContext().listenerBus()

    def last_execution() -> int:
        bus.waitUntilEmpty()  # the listener has seen every execution started so far
        executions = store.executionsList()
        return max(executions.apply(i).executionId() for i in range(executions.size()))

    def batches() -> tuple[int, list[list[int]]]:
        plan.analyse(spark)
        kept = []
        for start in (0, 1000):  # the first batch of the key runs CreateViewCommand; then both alternate
            kept.append(
                [
                    e.after["id"]
                    for e in plan.run(
                        spark, [event(i, "t", {"id": i, "text": "x"}) for i in range(start, start + 30)]
                    ).events
                ]
            )  # type: ignore[index]
        first = last_execution()
        for start in (2000, 3000, 4000, 5000):
            events = [event(i, "t", {"id": i, "text": f"t{i}"}) for i in range(start, start + 30)]
            kept.append([e.after["id"] for e in plan.run(spark, events).events])  # type: ignore[index]
        return last_execution() - first, kept

    executions, kept = await asyncio.get_running_loop().run_in_executor(spark.pool, batches)
    assert kept == [[i for i in range(s, s + 30) if i % 3 == 0] for s in range(0, 6000, 1000)]
    assert executions == 4  # one per batch; with createOrReplaceTempView, 8


async def test_a_failing_spark_job_is_retried_by_restarts_and_moves_no_checkpoint(
    spark: SparkRuntime,
) -> None:
    """assert_true fails the job of the batch holding seq 150 on every attempt (not a dead JVM)."""
    d = doc(
        sinks=[{"type": "stdout", "config": {"id": "a"}}],
        batch={"max_events": 50, "max_ms": 10},
        supervision={"max_restarts": 2, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}},
    )
    d["spec"]["processors"] = [{"type": "filter", "expr": "assert_true(after.seq <> 150) IS NULL"}]
    d["spec"]["spark"] = {"master": "local[2]"}  # the module's warm session
    sink = ScriptedSink("a")
    store = MemoryCheckpointStore()
    runner = PipelineRunner(
        parse_pipeline(d, env={}), store=store, sinks={"a": sink}, source=SyntheticSource(300, chunk=50)
    )
    await asyncio.wait_for(runner.run(), 120)
    assert runner.state == "failed" and "SparkTransformer" in (runner.failure or "")
    assert runner.ctx.stats.transform_failures == 3  # the first try and two restarts
    node = runner.snapshot().find("SparkTransformer")
    assert node is not None and node.restarts == 2
    # a prefix of the source was delivered and checkpointed, never the failing batch nor what follows
    got = first_occurrences(sink.received)
    assert got == list(range(1, len(got) + 1)) and 50 <= len(got) < 150
    cp = await store.get(sink_key("src", "a"))
    assert cp == {"seq": len(got)}


@pytest.mark.parametrize(
    "processors",
    [
        (ProcessorSpec("mask", "p0", columns=(("body", "hash"),)),),
        (
            ProcessorSpec("filter", "p0", expr="after.id > 0"),
            ProcessorSpec("mask", "p1", columns=(("body", "hash"),)),
        ),
        (ProcessorSpec("sql", "p0", query="SELECT * FROM batch"),),
    ],
    ids=["mask", "filter+mask", "sql"],
)
async def test_a_value_a_change_does_not_carry_stays_unsaid_through_spark(
    spark: SparkRuntime, processors: tuple[ProcessorSpec, ...]
) -> None:
    """An unchanged TOAST value (or one a partial row image left out) is a marker, not a value. A
    mask hashed the marker's JSON text, and the sink then wrote that hash over the value the row
    holds; and the marker made the whole column JSON text for its batch, so every other value
    of it was hashed with its quotes: one value, two hashes, by what else was in the batch. The
    marker now goes through Spark as NULL (what SQL knows of it) and comes back as it was."""
    schema = TableSchema("db", "t", (("id", pa.int64()), ("body", pa.string()), ("status", pa.string())))
    unchanged = {"__unchanged_toast__": True}
    events = [
        event(1, "t", {"id": 1, "body": "secret", "status": "new"}),
        event(
            2,
            "t",
            {"id": 1, "body": unchanged, "status": "paid"},
            op="u",
            before={"id": 1, "body": unchanged},
        ),
    ]
    out = await through_spark(spark, Plan(processors, [schema]), events)
    hashed = processors[-1].type == "mask"
    secret = hashlib.sha256(b"secret").hexdigest() if hashed else "secret"
    assert [e.after for e in out] == [
        {"id": 1, "body": secret, "status": "new"},
        {"id": 1, "body": unchanged, "status": "paid"},
    ]
    assert out[1].before is not None and out[1].before["body"] == unchanged


def test_with_images_copies_every_other_field_of_the_event() -> None:
    """The fast copy names every field: one added to Event and not to it would be left unset.
    The record made where the event was decoded is not copied: it is the old images'."""
    source = SourceInfo("mysql", "db", "t", {"file": "f", "pos": 4}, 17, "s")
    e = Event("u", {"id": 1}, {"id": 2}, source, "tx", True, "ev", (1, 2), {"pos": 9}, "tenant-a", 999,
              (b"{}", b"{}", b"k"))  # fmt: skip
    new = with_images(e, "d", {"id": 3}, None)
    assert new == dataclasses.replace(e, op="d", before={"id": 3}, after=None)
    for f in dataclasses.fields(Event):  # size and made do not take part in ==
        want = {"op": "d", "before": {"id": 3}, "after": None, "made": None}.get(f.name, getattr(e, f.name))
        assert getattr(new, f.name) == want, f.name


def test_new_event_sets_every_field_as_the_constructor_does() -> None:
    """The fast constructor of source rows builds a twin of Event and makes it an Event: the
    result is a real, frozen Event, equal to the constructor's."""
    source = SourceInfo("mysql", "db", "t", {"file": "f", "pos": 4}, 17, "s")
    args = ("r", None, {"id": 2}, source, "tx", True, "ev", (1, 2, 3), {"pos": 9}, "tenant-a", 999)
    for given in (args, (*args, (b'{"op":"r"}', b'{"id":2}', b"k"))):  # made given, or left out (None)
        new, built = new_event(*given), Event(*given)  # type: ignore[arg-type]
        assert type(new) is Event and new == built
        with pytest.raises(dataclasses.FrozenInstanceError):
            new.op = "d"  # type: ignore[misc]
        for f in dataclasses.fields(Event):  # size and made do not take part in ==
            assert getattr(new, f.name) == getattr(built, f.name), f.name


def test_new_source_info_sets_every_field_as_the_constructor_does() -> None:
    args = ("mysql", "db", "t", {"file": "f", "pos": 4}, 17, "s", ("id",))
    new, built = new_source_info(*args), SourceInfo(*args)  # type: ignore[arg-type]
    assert new == built
    for f in dataclasses.fields(SourceInfo):
        assert getattr(new, f.name) == getattr(built, f.name), f.name


def test_masked_values_from_spark_replace_only_their_columns() -> None:
    """Changes.apply: what a filter/mask job returns (kept _seq, masked values) put into the events."""
    events = [
        event(
            0,
            "t",
            {"id": 1, "email": "a@x", "card": "1111", "n": 7},
            op="u",
            before={"id": 1, "email": "o@x"},
        ),
        event(1, "t", {"id": 2, "email": "b@x"}),  # filtered out by the job
        event(2, "t", {"id": 3, "card": "3333"}),  # no email: nothing to mask there
    ]
    originals = [dataclasses.replace(e) for e in events]
    sent = to_arrow(events, [0, 1, 2], None)
    result = pa.table({"_seq": [0, 2], "c0": ["h-old", None], "c1": ["h-a", None]})
    changes = Changes((("before", "email"), ("after", "email")), frozenset({"card"}))
    out = changes.apply(result, events, sent, "p")
    assert [q for q, _ in out] == [0, 2]
    [(_, first), (_, third)] = out
    assert first.after == {"id": 1, "email": "h-a", "n": 7} and first.before == {"id": 1, "email": "h-old"}
    assert third.after == {"id": 3} and third.before is None
    assert (first.op, first.order, first.checkpoint.to_doc()) == ("u", (0,), {"seq": 0})
    assert [e.after for e in events] == [e.after for e in originals]  # the source's dicts are untouched
    with pytest.raises(TransformError, match="_seq \\(7\\) was not in the batch"):
        changes.apply(pa.table({"_seq": [7], "c0": ["x"], "c1": ["y"]}), events, sent, "p")
    # a filter alone returns just _seq: the kept events are the very same objects
    kept = Changes((), frozenset()).apply(pa.table({"_seq": [1]}), events, sent, "p")
    assert kept == [(1, events[1])] and kept[0][1] is events[1]
