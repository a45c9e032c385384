"""The Kafka source (issue 19) against a real private Tansu broker: topics into a file and a
PostgreSQL upsert, SIGKILLs without loss or offsets committed past the sinks, a MariaDB → Kafka →
PostgreSQL round trip, malformed records, rebalances and transactional topics. Positions and
envelope parsing in-process: tests/test_kafka_records.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.replay import ReplayFailed
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore
from deltaforge.state.deadletters import Select
from tests.helpers import jsonl, next_offsets, offsets_in_order, wait_until, wait_until_sync
from tests.mysql_kit import fresh_db as fresh_mariadb_db
from tests.postgres_kit import fresh_db
from tests.serve_proc import serve_pipeline
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu


def produce(bootstrap: str, records: list[tuple[str, int, bytes | None, bytes | None]]) -> None:
    """``(topic, partition, key, value)`` records, in this order, acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "log_level": 3})
    for i, (topic, part, key, value) in enumerate(records):
        while True:
            try:
                p.produce(topic, value, key, partition=part)
                break
            except BufferError:
                p.poll(0.1)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def source_doc(brokers: str, topics: Any, group: str, fmt: str, **extra: Any) -> dict[str, Any]:
    return {"type": "kafka", "config": {"id": "k", "brokers": brokers, "topics": topics, "group_id": group,
                                        "format": fmt, **extra}}  # fmt: skip


def pipeline(name: str, source: dict[str, Any], sinks: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": name, "tenant": "acme"},
        "spec": {"source": source, "sinks": sinks, "batch": {"max_events": 2000, "max_ms": 50},
                 "supervision": {"max_restarts": 50, "within_seconds": 60, "backoff": {"base_ms": 10, "max_ms": 200}},
                 **spec},
    }  # fmt: skip


async def committed(bootstrap: str, group: str, topic: str, parts: int = 3) -> dict[int, int]:
    """The group's committed offsets, read by a consumer that joins nothing."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        out = {}
        for p in range(parts):
            o = await c.committed(TopicPartition(topic, p))
            if o is not None:
                out[p] = o
        return out
    finally:
        await c.stop()


def change(n: int, rid: int, first: bool) -> bytes:
    """A Debezium envelope of a foreign connector: position ``n`` (the record's number)."""
    return orjson.dumps({"op": "c" if first else "u", "before": None, "after": {"id": rid, "v": n},
                         "source": {"connector": "test", "db": "shop", "table": "items", "ts_ms": 1, "n": n},
                         "ts_ms": 1})  # fmt: skip


async def test_100k_records_of_three_partitions_reach_a_file_and_postgres_whole_and_in_order(
    tansu: Tansu, postgres: Postgres, tmp_path: Path
) -> None:
    topic, n, keys = "orders", 100_000, 999
    tansu.create_topic(topic, 3)
    records, seen = [], set()
    for i in range(n):
        rid = i % keys
        records.append((topic, rid % 3, orjson.dumps({"id": rid}), change(i, rid, rid not in seen)))
        seen.add(rid)
    produce(tansu.bootstrap, records)
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL)")
    out = tmp_path / "out.jsonl"
    doc = pipeline("k2", source_doc(tansu.bootstrap, [topic], "g1", "debezium"), [
        {"type": "file", "config": {"id": "f", "path": str(out), "envelope": "debezium"}},
        {"type": "postgres", "config": {"id": "p", "dsn": postgres.dsn(db)}},
    ])  # fmt: skip
    runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: runner.ctx.stats.events_committed >= n or task.done(), timeout=240,
                         what="100k records delivered")  # fmt: skip
        assert runner.state == "running", runner.failure
    finally:
        await runner.drain()
        await task
    lines = jsonl(out)
    numbers = [line["source"]["n"] for line in lines]
    assert sorted(set(numbers)) == list(range(n))
    for part in range(3):  # each partition's records in the order they were written
        mine = [x for x in numbers if (x % keys) % 3 == part]
        assert mine == sorted(mine)
    final = {r["id"]: r["v"] for r in await conn.fetch("SELECT id, v FROM items")}
    await conn.close()
    assert final == {rid: max(i for i in range(n - keys, n) if i % keys == rid) for rid in range(keys)}
    held = await committed(tansu.bootstrap, "g1", topic)
    assert sum(held.values()) == n  # every record's offset committed once both sinks had it


def test_sigkill_three_times_loses_nothing_and_never_commits_past_the_sink(
    tansu: Tansu, tmp_path: Path
) -> None:
    topic, n = "clicks", 60_000
    tansu.create_topic(topic, 3)
    produce(tansu.bootstrap, [(topic, i % 3, None, b"%d" % i) for i in range(n)])
    out = tmp_path / "out.jsonl"
    spec = pipeline("kk", source_doc(tansu.bootstrap, [topic], "g2", "raw", max_records=500,
                                      session_timeout_ms=6000), [
        {"type": "file", "config": {"id": "f", "path": str(out)}},
    ], storage={"type": "sqlite", "path": str(tmp_path / "cp.db")})["spec"]  # fmt: skip
    spec["batch"] = {"max_events": 500, "max_ms": 50}

    def held_by_file() -> dict[int, int]:
        return next_offsets([line["after"] for line in jsonl(out)], 3)

    rng = random.Random(19)
    for target in sorted(rng.sample(range(5_000, n - 5_000), 3)):
        with serve_pipeline(tmp_path, spec, name="kk") as serve:
            wait_until_sync(lambda: out.exists() and len(jsonl(out)) >= target, timeout=120,  # noqa: B023
                            what=f"{target} lines")  # fmt: skip
            serve.kill()
        group = asyncio.run(committed(tansu.bootstrap, "g2", topic))
        file = held_by_file()
        assert all(o <= file[p] for p, o in group.items()), (group, file)
    everything = {p: n // 3 for p in range(3)}

    def all_committed() -> bool:
        return (
            held_by_file() == everything
            and asyncio.run(committed(tansu.bootstrap, "g2", topic)) == everything
        )

    with serve_pipeline(tmp_path, spec, name="kk") as serve:
        # The member killed last holds its partitions until its session times out, and the file may
        # hold all of them already (delivered before the kill, not yet committed): wait until this
        # member got them, re-read past the checkpoint and committed.
        wait_until_sync(all_committed, timeout=180, what="every record delivered and committed")
        serve.terminate()
    lines = jsonl(out)
    values = [int(line["after"]["value"]) for line in lines]
    assert set(values) == set(range(n))
    for p in range(3):  # per partition: the first time each record arrived, in offset order
        firsts = offsets_in_order([line["after"] for line in lines], p)
        assert firsts == sorted(firsts)
    assert asyncio.run(committed(tansu.bootstrap, "g2", topic)) == everything  # the clean stop kept it


async def test_mariadb_through_a_debezium_topic_rebuilds_the_table_in_postgres_if_newer(
    mariadb: MariaDB, tansu: Tansu, postgres: Postgres, tmp_path: Path
) -> None:
    """MariaDB → Kafka (debezium) → a second pipeline reading the topic → PostgreSQL ``if_newer``:
    inserts, updates, deletes and primary-key moves end with the two tables equal."""
    from tests.snapshot_kit import Execute, Writer

    my = fresh_mariadb_db(mariadb)
    with mariadb.root(my) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL, payload varchar(64))")
        cur.execute("INSERT INTO items SELECT seq, seq, 'x' FROM seq_1_to_500")
    tansu.create_topic("rt.items", 3)
    pg = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(pg))
    await conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL, payload text, "
                       "_df_position text)")  # fmt: skip
    upstream = pipeline("up", {"type": "mysql", "config": {"id": "my", "dsn": mariadb.dsn(my), "tables": [f"{my}.items"]}},
                        [{"type": "kafka", "config": {"id": "k", "brokers": tansu.bootstrap, "topic": "rt.${source.table}",
                                                      "envelope": "debezium"}}])  # fmt: skip
    downstream = pipeline("down", source_doc(tansu.bootstrap, "/rt\\..*/", "g3", "debezium"),
                          [{"type": "postgres", "config": {"id": "p", "dsn": postgres.dsn(pg),
                                                           "upsert_strategy": "if_newer"}}])  # fmt: skip
    runners = [
        PipelineRunner(parse_pipeline(d), store=MemoryCheckpointStore()) for d in (upstream, downstream)
    ]
    tasks = [asyncio.create_task(r.run()) for r in runners]

    def connect() -> tuple[Execute, Any]:
        c = mariadb.root(my)
        cur = c.cursor()
        return (lambda sql, args: cur.execute(sql, args)), c.close

    work = Writer(connect, 500, seed=19, rate=1000)
    work.start()
    try:
        await wait_until(lambda: sum(work.ops.values()) >= 3000 or work.error is not None, timeout=60,
                         what="3000 writes")  # fmt: skip
    finally:
        work.stop.set()
        work.join()
    assert work.error is None and work.ops["move"] > 0 and work.ops["delete"] > 0
    with mariadb.root(my) as c, c.cursor() as cur:
        cur.execute("SELECT id, v, payload FROM items")
        expected = {int(i): (int(v), p) for i, v, p in cur.fetchall()}

    async def table() -> dict[int, tuple[int, str]]:
        return {r["id"]: (r["v"], r["payload"]) for r in await conn.fetch("SELECT id, v, payload FROM items")}

    got: dict[int, tuple[int, str]] = {}
    try:
        for _ in range(600):
            got = await table()
            if got == expected or any(t.done() for t in tasks):
                break
            await asyncio.sleep(0.1)  # polling the target table; nothing to wait on in-process
        assert [r.state for r in runners] == ["running", "running"], [r.failure for r in runners]
        assert got == expected
    finally:
        for r in runners:
            await r.drain()
        await asyncio.gather(*tasks)
        await conn.close()


@pytest.mark.parametrize("journal", [False, True])
async def test_a_malformed_record_halts_naming_it_or_goes_to_the_dlq(
    tansu: Tansu, tmp_path: Path, journal: bool
) -> None:
    topic = f"bad{int(journal)}"
    tansu.create_topic(topic, 1)
    produce(tansu.bootstrap, [(topic, 0, None, change(0, 1, True)), (topic, 0, None, b"{oops"),
                              (topic, 0, None, change(2, 1, False))])  # fmt: skip
    out = tmp_path / "out.jsonl"
    doc = pipeline("m", source_doc(tansu.bootstrap, [topic], f"g{topic}", "debezium"),
                   [{"type": "file", "config": {"id": "f", "path": str(out)}}],
                   journal={"enabled": journal})  # fmt: skip
    runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    where = f"topic {topic} partition 0 offset 1"
    try:
        if journal:
            await wait_until(lambda: runner.ctx.stats.events_committed >= 2 or task.done(), timeout=60,
                             what="both good records")  # fmt: skip
            assert runner.state == "running", runner.failure
            assert runner.ctx.dlq is not None and runner.ctx.dlq.added == 1
            (entry,) = await runner.store.dead_letters.select("m", Select())
            assert where in entry["error"] and entry["sink"] == "source:k"
            with pytest.raises(ReplayFailed, match="the source could not read"):
                await runner.replay_dead_letters(Select())
        else:
            await asyncio.wait_for(task, 60)
            assert runner.state == "failed"
            assert runner.failure is not None and where in runner.failure and "not JSON" in runner.failure
    finally:
        await runner.drain()
        await task
    delivered = [line["source"]["n"] for line in jsonl(out)] if out.exists() else []
    held = (await committed(tansu.bootstrap, f"g{topic}", topic, parts=1)).get(0, 0)
    if journal:
        assert (delivered, held) == ([0, 2], 3)
    else:  # nothing past the record that stopped it: not delivered, not committed
        assert delivered in ([], [0]) and held <= 1


def test_a_rebalance_commits_only_what_the_sink_holds_and_loses_nothing(tansu: Tansu, tmp_path: Path) -> None:
    """A second member joins the group mid-stream and leaves again: the partitions the pipeline
    gives up are committed no further than its file holds, and every record ends in the file."""
    import threading

    topic = "reb"
    tansu.create_topic(topic, 3)
    sent = {0: 0, 1: 0, 2: 0}
    stop = threading.Event()

    def write() -> None:  # a steady stream for the whole test
        p = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 5, "log_level": 3})
        i = 0
        while not stop.is_set():
            for _ in range(100):
                p.produce(topic, b"%d" % i, partition=i % 3)
                sent[i % 3] += 1
                i += 1
            p.flush(10)
            stop.wait(0.05)  # pacing the writer
        assert p.flush(30) == 0

    out = tmp_path / "out.jsonl"
    doc = pipeline("rb", source_doc(tansu.bootstrap, [topic], "g4", "raw", max_records=500),
                   [{"type": "file", "config": {"id": "f", "path": str(out)}}])  # fmt: skip

    def held() -> dict[int, int]:
        return next_offsets([line["after"] for line in jsonl(out)] if out.exists() else [], 3)

    async def scenario() -> None:
        runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
        task = asyncio.create_task(runner.run())
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        source = runner.ctx.source
        try:
            await wait_until(
                lambda: runner.ctx.stats.events_committed >= 2000, timeout=60, what="2000 records"
            )
            other = AIOKafkaConsumer(topic, bootstrap_servers=tansu.bootstrap, group_id="g4",
                                     enable_auto_commit=False, auto_offset_reset="earliest")  # fmt: skip
            await other.start()
            while not other.assignment():  # joins: the pipeline gives partitions up
                await other.getmany(timeout_ms=200)
            taken = {tp.partition for tp in other.assignment()}
            assert len(source.consumer.assignment()) < 3  # type: ignore[attr-defined]
            group = await committed(tansu.bootstrap, "g4", topic)
            file = held()
            assert all(group.get(p, 0) <= file[p] for p in taken), (group, file)
            await other.stop()  # leaves: the pipeline takes them back
            await wait_until(lambda: len(source.consumer.assignment()) == 3, timeout=60,  # type: ignore[attr-defined]
                             what="partitions back")  # fmt: skip
            stop.set()
            await asyncio.to_thread(writer.join)
            await wait_until(lambda: held() == sent, timeout=120, what="every record in the file")
            assert runner.state == "running", runner.failure
        finally:
            stop.set()
            await runner.drain()
            await task
        assert await committed(tansu.bootstrap, "g4", topic) == sent

    asyncio.run(scenario())


def transactional(bootstrap: str, topic: str, batches: list[tuple[list[bytes], bool]]) -> None:
    """Each ``(values, commit)`` in one transaction, committed or aborted."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "log_level": 3})
    p.init_transactions(30)
    for values, commit in batches:
        p.begin_transaction()
        for v in values:
            p.produce(topic, v, partition=0)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


async def _read_topic(
    tansu: Tansu, topic: str, tmp_path: Path, expect: int
) -> tuple[list[str], PipelineRunner]:
    out = tmp_path / "out.jsonl"
    doc = pipeline("tx", source_doc(tansu.bootstrap, [topic], f"g{topic}", "raw"),
                   [{"type": "file", "config": {"id": "f", "path": str(out)}}])  # fmt: skip
    runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: runner.ctx.stats.events_committed >= expect or task.done(), timeout=60,
                         what=f"{expect} records")  # fmt: skip
    finally:
        await runner.drain()
        await task
    return [line["after"]["value"] for line in jsonl(out)], runner


async def test_committed_transactions_of_a_topic_are_read_whole(tansu: Tansu, tmp_path: Path) -> None:
    tansu.create_topic("txok", 1)
    transactional(tansu.bootstrap, "txok", [([b"a1", b"a2"], True), ([b"b1", b"b2", b"b3"], True)])
    values, runner = await _read_topic(tansu, "txok", tmp_path, 5)
    assert values == ["a1", "a2", "b1", "b2", "b3"]
    assert runner.state == "stopped"


async def test_aborted_transactions_of_a_topic_are_not_read(tansu: Tansu, tmp_path: Path) -> None:
    """read_committed: aiokafka drops aborted records itself (from the fetch's aborted-transaction
    list), so the Tansu bug that shows them to librdkafka's read_committed consumers does not reach
    this source."""
    tansu.create_topic("txab", 1)
    transactional(tansu.bootstrap, "txab", [([b"a1"], True), ([b"x1", b"x2"], False), ([b"b1"], True)])
    values, _ = await _read_topic(tansu, "txab", tmp_path, 2)
    assert values == ["a1", "b1"]


def relay(
    name: str, source: dict[str, Any], brokers: str, target_dsn: str, envelope: str = "debezium"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two pipelines: ``source`` → the Kafka topic ``<name>.<table>`` (``envelope``), and that
    topic → PostgreSQL (if_newer) at ``target_dsn``."""
    upstream = pipeline(f"{name}up", source, [{"type": "kafka", "config": {"id": "k", "brokers": brokers,
                                                "topic": f"{name}.${{source.table}}", "envelope": envelope}}])  # fmt: skip
    fmt = "native" if envelope == "native" else "debezium"
    downstream = pipeline(f"{name}down", source_doc(brokers, f"/{name}\\..*/", f"g{name}", fmt),
                          [{"type": "postgres", "config": {"id": "p", "dsn": target_dsn, "upsert_strategy": "if_newer"}}])  # fmt: skip
    return upstream, downstream


@contextlib.asynccontextmanager
async def running_both(docs: tuple[dict[str, Any], dict[str, Any]]) -> AsyncIterator[list[PipelineRunner]]:
    """``docs``' pipelines running; drained on the way out."""
    runners = [PipelineRunner(parse_pipeline(d), store=MemoryCheckpointStore()) for d in docs]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    try:
        yield runners
    finally:
        for r in runners:
            await r.drain()
        await asyncio.gather(*tasks)


async def all_applied(runners: list[PipelineRunner], changes: int) -> None:
    """Until the second pipeline has applied ``changes`` changes; both still running."""
    down = runners[1]
    await wait_until(lambda: down.ctx.stats.events_committed >= changes or down.state != "running",
                     timeout=60, what="every change applied downstream")  # fmt: skip
    assert [r.state for r in runners] == ["running", "running"], [r.failure for r in runners]


async def through_a_topic(
    servers: tuple[MariaDB, Tansu, Postgres],
    name: str,
    ddl: tuple[str, str],
    statements: list[str],
    changes: int,
    query: str,
    envelope: str = "debezium",
) -> list[tuple[Any, ...]]:
    """MariaDB table ``v`` (``ddl[0]``) → a Kafka topic (``envelope``) → a second pipeline reading
    it → PostgreSQL table ``v`` (``ddl[1]``, if_newer): ``statements`` run upstream (UTC), and once
    ``changes`` changes are applied downstream, the rows of ``query`` on the target."""
    mariadb, tansu, postgres = servers
    my = fresh_mariadb_db(mariadb)
    with mariadb.root(my) as c, c.cursor() as cur:
        cur.execute(ddl[0])
    tansu.create_topic(f"{name}.v", 1)
    pg = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(pg))
    await conn.execute(ddl[1])
    source = {"type": "mysql", "config": {"id": "my", "dsn": mariadb.dsn(my), "tables": [f"{my}.v"]}}
    try:
        async with running_both(relay(name, source, tansu.bootstrap, postgres.dsn(pg), envelope)) as runners:
            await wait_until(lambda: runners[0].state == "running", timeout=60, what="upstream running")
            with mariadb.root(my) as c, c.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                for sql in statements:
                    cur.execute(sql)
            await all_applied(runners, changes)
            return [tuple(r) for r in await conn.fetch(query)]
    finally:
        await conn.close()


async def test_values_of_every_kind_survive_the_trip_through_a_topic_into_postgres(
    mariadb: MariaDB, tansu: Tansu, postgres: Postgres
) -> None:
    """MariaDB → Kafka → PostgreSQL: a topic carries values as JSON, so dates and times arrive as
    ISO text, bytes as base64, decimals as text. Each must reach the target column of its type
    as the value the source held (a date column refused the text: every change was poison)."""
    from datetime import UTC, date, datetime, time
    from decimal import Decimal

    ddl = (
        "CREATE TABLE v (id int PRIMARY KEY, d DATE, dt DATETIME(6), ts TIMESTAMP(3) NULL, dec1 DECIMAL(30,10), "
        "u BIGINT UNSIGNED, f DOUBLE, vb VARBINARY(16), bl BLOB, j JSON, tm TIME(3), flag TINYINT(1), "
        "e ENUM('a','b c'), s SET('x','y'), b5 BIT(5), b1 BIT(1))",
        "CREATE TABLE v (id int PRIMARY KEY, d date, dt timestamp, ts timestamptz, dec1 numeric, u numeric, "
        "f float8, vb bytea, bl bytea, j jsonb, tm time, flag boolean, e text, s text, b5 bit(5), b1 boolean, "
        "_df_position text)",
    )
    statements = [
        """INSERT INTO v VALUES
        (1, '2024-02-29', '2024-02-29 23:59:59.000001', '2024-02-29 12:00:00.125', '-12345678901234567890.0123456789',
         18446744073709551615, 0.1, x'00ff10', x'deadbeef', '{"a": [1, "x"], "n": 1.5}', '23:59:59.999', 1, 'b c', 'x,y', b'10110', b'1'),
        (2, '0001-01-01', '9999-12-31 23:59:59', '1970-01-01 00:00:01', 0, 0, -2.5e300, '', '', '[]', '00:00:00', 0, 'a', '', b'00000', b'0'),
        (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
        "UPDATE v SET d = '2000-01-02', vb = x'41' WHERE id = 3",
    ]
    got = await through_a_topic((mariadb, tansu, postgres), "rt2", ddl, statements, 4,
                                "SELECT id, d, dt, ts, dec1, u, f, vb, bl, j, tm, flag, e, s, b5::text, b1 FROM v ORDER BY id")  # fmt: skip
    utc = UTC
    assert got == [
        (1, date(2024, 2, 29), datetime(2024, 2, 29, 23, 59, 59, 1), datetime(2024, 2, 29, 12, 0, 0, 125_000, utc),
         Decimal("-12345678901234567890.0123456789"), Decimal(18446744073709551615), 0.1, b"\x00\xff\x10",
         b"\xde\xad\xbe\xef", '{"a": [1, "x"], "n": 1.5}', time(23, 59, 59, 999_000), True, "b c", "x,y", "10110", True),
        (2, date(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59), datetime(1970, 1, 1, 0, 0, 1, tzinfo=utc),
         Decimal(0), Decimal(0), -2.5e300, b"", b"", "[]", time(0), False, "a", "", "00000", False),
        (3, date(2000, 1, 2), None, None, None, None, None, b"A", None, None, None, None, None, None, None, None),
    ]  # fmt: skip


def _assigned(runner: PipelineRunner) -> set[str]:
    consumer = getattr(runner.source, "consumer", None)
    return set() if consumer is None else {f"{tp.topic}:{tp.partition}" for tp in consumer.assignment()}


async def test_start_latest_skips_what_was_there_before_the_first_start_and_nothing_after(
    tansu: Tansu, tmp_path: Path
) -> None:
    """``start: latest`` leaves out the records a topic held when the pipeline first started, and
    only those: a topic matching the pattern that appears while it runs, or while it is stopped,
    is read from its first record. (It started at its end once the consumer saw it, up to five
    minutes later: every record written to it before then was skipped without a word.)"""
    out = tmp_path / "out.jsonl"

    def values() -> set[str]:
        return {line["after"]["value"] for line in jsonl(out)}

    tansu.create_topic("nt.a", 2)
    produce(tansu.bootstrap, [("nt.a", p, None, b"old") for p in (0, 1)])
    doc = pipeline("nt", source_doc(tansu.bootstrap, "/nt\\..*/", "gnt", "raw", start="latest"),
                   [{"type": "file", "config": {"id": "f", "path": str(out)}}])  # fmt: skip
    store = MemoryCheckpointStore()

    async def run(parts: int, new_topic: str, news: int) -> None:
        """Once ``parts`` partitions are held: ``news`` records in a topic made now, then one more in
        each of its partitions once the pipeline holds them too, which must arrive after them."""
        runner = PipelineRunner(parse_pipeline(doc), store=store)
        task = asyncio.create_task(runner.run())
        try:
            await wait_until(lambda: len(_assigned(runner)) == parts or task.done(), timeout=60,
                             what=f"{parts} partitions assigned")  # fmt: skip
            produce(tansu.bootstrap, [("nt.a", 0, None, f"a{parts}".encode())])
            if news:
                tansu.create_topic(new_topic, 2)
                produce(
                    tansu.bootstrap,
                    [(new_topic, i % 2, None, f"{new_topic}-{i}".encode()) for i in range(news)],
                )
            await wait_until(lambda: len(_assigned(runner)) == parts + 2 * bool(news) or task.done(), timeout=60,
                             what=f"{new_topic} assigned")  # fmt: skip
            lasts = {f"last-{parts}-{p}" for p in (0, 1)}
            produce(tansu.bootstrap, [(new_topic, p, None, f"last-{parts}-{p}".encode()) for p in (0, 1)])
            await wait_until(lambda: lasts <= values() or task.done(), timeout=60, what=f"{lasts}")
            assert runner.state == "running", runner.failure
        finally:
            await runner.drain()
            await task

    await run(2, "nt.b", 10)  # a topic made while it runs
    tansu.create_topic("nt.c", 2)  # and one made while it is stopped
    produce(tansu.bootstrap, [("nt.c", i % 2, None, f"nt.c-{i}".encode()) for i in range(6)])
    await run(6, "nt.c", 0)
    assert values() == {"a2", "a6", *(f"nt.b-{i}" for i in range(10)), *(f"nt.c-{i}" for i in range(6)),
                        "last-2-0", "last-2-1", "last-6-0", "last-6-1"}  # fmt: skip


async def test_a_sink_added_under_start_latest_leaves_the_first_sink_nothing_missed(
    tansu: Tansu, tmp_path: Path
) -> None:
    """Sink b is added while the pipeline is down, and the group has no committed offsets any more
    (renamed here; expired, in a quiet week): the source opened as with no checkpoint at all, at the
    partitions' ends, and sink a never got the record written meanwhile. Now it opens at a's
    checkpoint; b gets what follows it."""
    tansu.create_topic("ns.a", 1)

    def values(sink: str) -> list[str]:
        path = tmp_path / f"{sink}.jsonl"
        return [line["after"]["value"] for line in jsonl(path)] if path.exists() else []

    store = MemoryCheckpointStore()

    async def run(group: str, sinks: list[str], write: str) -> None:
        doc = pipeline("ns", source_doc(tansu.bootstrap, ["ns.a"], group, "raw", start="latest"),
                       [{"type": "file", "config": {"id": s, "path": str(tmp_path / f"{s}.jsonl")}} for s in sinks])  # fmt: skip
        runner = PipelineRunner(parse_pipeline(doc), store=store)
        task = asyncio.create_task(runner.run())
        try:
            await wait_until(lambda: len(_assigned(runner)) == 1 or task.done(), timeout=60, what="assigned")
            produce(tansu.bootstrap, [("ns.a", 0, None, write.encode())])
            await wait_until(lambda: all(write in values(s) for s in sinks) or task.done(), timeout=60,
                             what=f"{write} delivered")  # fmt: skip
            assert runner.state == "running", runner.failure
        finally:
            await runner.drain()
            await task

    await run("g1", ["a"], "one")
    produce(tansu.bootstrap, [("ns.a", 0, None, b"two")])  # while the pipeline is down
    await run("g2", ["a", "b"], "three")
    assert values("a") == ["one", "two", "three"]
    assert values("b") == ["two", "three"]


@pytest.mark.parametrize("envelope", ["debezium", "native"])
async def test_a_truncate_read_from_a_topic_empties_the_target(
    mariadb: MariaDB, tansu: Tansu, postgres: Postgres, envelope: str
) -> None:
    """A TRUNCATE upstream is an ``op: t`` record in the topic; read back, it truncates the
    PostgreSQL target as it does reading the database itself. (It was a malformed record: the
    pipeline halted on it, or, with the journal on, the target kept every row the source dropped.)"""
    got = await through_a_topic(
        (mariadb, tansu, postgres), f"tr{envelope[0]}",
        ("CREATE TABLE v (id int PRIMARY KEY, x int)", "CREATE TABLE v (id int PRIMARY KEY, x int, _df_position text)"),
        ["INSERT INTO v VALUES (1, 1), (2, 2)", "TRUNCATE TABLE v", "INSERT INTO v VALUES (3, 3)"], 4,
        "SELECT id, x FROM v ORDER BY id", envelope,
    )  # fmt: skip
    assert got == [(3, 3)]


@pytest.mark.parametrize("connector", ["test", "mysql"])
async def test_partitions_read_into_one_redis_stream_exactly_once_lose_nothing(
    tansu: Tansu, redis_server: Redis, connector: str
) -> None:
    """A Redis sink with ``exactly_once`` writes a change only past its stream's watermark, the
    last source position written. Partitions of a topic are read interleaved, and their records'
    positions (offsets, or a deltaforge upstream's binlog positions) do not grow across them:
    every record behind the watermark another partition had moved was dropped without a word.
    Read from Kafka, the watermark follows each partition on its own, and a replay of them all
    still writes nothing twice."""
    topic = f"eo{connector}"
    tansu.create_topic(topic, 3)
    records = []
    for i in range(300):  # row i in partition i % 3; upstream positions grow with i
        source = {"connector": connector, "db": "shop", "table": "items", "ts_ms": 1,
                  "file": "mysql-bin.000001", "pos": 1000 + i, "row": 0, "gtid": "", "tx_start": 900 + i}  # fmt: skip
        value = orjson.dumps({"op": "c", "before": None, "after": {"id": i}, "source": source, "ts_ms": 1})
        records.append((topic, (i * 7) % 3, orjson.dumps({"id": i}), value))
    records.sort(key=lambda r: r[1] == 0)  # partition 0's records, the first positions, last
    produce(tansu.bootstrap, records)
    doc = pipeline("eo", source_doc(tansu.bootstrap, [topic], f"g{topic}", "debezium"),
                   [{"type": "redis", "config": {"id": "r", "uri": redis_server.uri(), "stream": "out",
                                                 "exactly_once": True}}])  # fmt: skip
    for group in (f"g{topic}", f"g{topic}again"):  # the second reads it all again: a replay
        doc["spec"]["source"]["config"]["group_id"] = group
        runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
        task = asyncio.create_task(runner.run())
        try:
            await wait_until(lambda: runner.ctx.stats.events_committed >= 300 or task.done(), timeout=60,  # noqa: B023
                             what="300 records delivered")  # fmt: skip
            assert runner.state == "running", runner.failure
        finally:
            await runner.drain()
            await task
    ids = [orjson.loads(f[b"event"])["after"]["id"] for _, f in redis_server.client().xrange("out")]
    assert sorted(ids) == list(range(300))  # each once: the replay wrote nothing


def debezium_record(
    after: dict[str, Any], fields: list[dict[str, Any]], op: str = "c", pos: int = 154
) -> bytes:
    """A Debezium MySQL connector's change record as Kafka Connect's JsonConverter writes it, with
    its inline schema (``schemas.enable``, the default)."""
    row = {"type": "struct", "optional": True, "name": "dbserver1.inventory.v.Value", "fields": fields}
    source = {"version": "2.7.0.Final", "connector": "mysql", "name": "dbserver1", "ts_ms": 1700000000000,
              "snapshot": "false", "db": "inventory", "table": "v", "server_id": 223344, "gtid": None,
              "file": "mysql-bin.000003", "pos": pos, "row": 0, "thread": 7, "query": None}  # fmt: skip
    schema = {"type": "struct", "name": "dbserver1.inventory.v.Envelope", "optional": False, "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "field": "source", "optional": False, "name": "io.debezium.connector.mysql.Source",
         "fields": []},
        {"type": "string", "field": "op", "optional": False}, {"type": "int64", "field": "ts_ms", "optional": True},
    ]}  # fmt: skip
    payload = {"before": None, "after": after, "source": source, "op": op, "ts_ms": 1700000000001}
    return orjson.dumps({"schema": schema, "payload": payload})


async def debezium_topic_into_postgres(
    servers: tuple[Tansu, Postgres], topic: str, records: list[bytes], ddl: str, query: str
) -> list[tuple[Any, ...]]:
    """``records`` (of row ``id`` 1, in order, or keyed by their ``after.id``) in a new ``topic``,
    read into a new PostgreSQL table by an if_newer sink: the rows of ``query`` once every
    record is applied."""
    tansu, postgres = servers
    tansu.create_topic(topic, 1)
    keyed = [(topic, 0, orjson.dumps({"id": orjson.loads(r)["payload"]["after"]["id"]}), r) for r in records]
    produce(tansu.bootstrap, keyed)
    pg = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(pg))
    await conn.execute(ddl)
    doc = pipeline(f"g{topic}", source_doc(tansu.bootstrap, [topic], f"g{topic}", "debezium"),
                   [{"type": "postgres", "config": {"id": "p", "dsn": postgres.dsn(pg), "upsert_strategy": "if_newer"}}])  # fmt: skip
    runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: runner.ctx.stats.events_committed >= len(records) or task.done(), timeout=60,
                         what="every record applied")  # fmt: skip
        assert runner.state == "running", runner.failure
        return [tuple(r) for r in await conn.fetch(query)]
    finally:
        await runner.drain()
        await task
        await conn.close()


async def test_a_debezium_topics_logical_types_reach_postgres_as_the_values_they_stand_for(
    tansu: Tansu, postgres: Postgres
) -> None:
    """Debezium writes a date as days since 1970, a timestamp as micro- or milliseconds, a time as
    microseconds, a decimal as base64 of its unscaled bytes, bytes as base64, naming each type in
    the record's schema. Read back, each reaches the PostgreSQL column of its type as the value it
    stands for (a date column refused the number: every change was poison; a numeric column
    took the base64 text)."""
    from datetime import date, datetime, time
    from decimal import Decimal

    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "d"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "dt"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "ms"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "version": 1, "field": "tm"},
        {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
         "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
        {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
         "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}], "field": "n"},
        {"type": "bytes", "optional": True, "field": "b"},
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "zt"},
    ]  # fmt: skip
    rows = [
        {"id": 1, "d": 19782, "dt": 1709251199000001, "ms": 1709251199123, "tm": 86399999999,
         "price": "/zM=", "n": {"scale": 3, "value": "AeJA"}, "b": "AP8Q", "zt": "2024-02-29T12:00:00.5Z"},
        {"id": 2, "d": -719162, "dt": -1, "ms": 0, "tm": 0, "price": "AA==", "n": {"scale": 0, "value": "AA=="},
         "b": "", "zt": None},
    ]  # fmt: skip
    got = await debezium_topic_into_postgres(
        (tansu, postgres), "dbserver1.inventory.v", [debezium_record(r, fields) for r in rows],
        "CREATE TABLE v (id int PRIMARY KEY, d date, dt timestamp, ms timestamp, tm time, price numeric, n numeric, "
        "b bytea, zt timestamptz, _df_position text)",
        "SELECT id, d, dt, ms, tm, price, n, b, zt FROM v ORDER BY id",
    )  # fmt: skip
    from datetime import UTC

    assert got == [
        (1, date(2024, 2, 29), datetime(2024, 2, 29, 23, 59, 59, 1), datetime(2024, 2, 29, 23, 59, 59, 123_000),
         time(23, 59, 59, 999_999), Decimal("-2.05"), Decimal("123.456"), b"\x00\xff\x10",
         datetime(2024, 2, 29, 12, 0, 0, 500_000, UTC)),
        (2, date(1, 1, 1), datetime(1969, 12, 31, 23, 59, 59, 999_999), datetime(1970, 1, 1), time(0),
         Decimal("0.00"), Decimal(0), b"", None),
    ]  # fmt: skip


async def test_debeziums_unavailable_value_placeholder_leaves_the_targets_value_as_it_is(
    tansu: Tansu, postgres: Postgres
) -> None:
    """Debezium's PostgreSQL connector writes an unchanged TOASTed column it could not read as
    ``__debezium_unavailable_value`` (bytes: those bytes, in base64; an array: a list of it).
    Read back, it is deltaforge's unchanged-TOAST marker, which the PostgreSQL sink leaves out
    of its update: the target keeps the value. (The placeholder was written into the column.)"""
    placeholder = "__debezium_unavailable_value"
    fields = [{"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "doc"},
              {"type": "bytes", "optional": True, "field": "blob"},
              {"type": "array", "optional": True, "items": {"type": "string"}, "field": "tags"},
              {"type": "int32", "optional": True, "field": "v"}]  # fmt: skip
    first = {"id": 1, "doc": "x" * 10_000, "blob": "AAEC", "tags": ["a", "b"], "v": 1}
    later = {"id": 1, "doc": placeholder, "blob": base64.b64encode(placeholder.encode()).decode(), "tags": [placeholder],
             "v": 2}  # fmt: skip
    got = await debezium_topic_into_postgres(
        (tansu, postgres), "dbserver1.public.v",
        [debezium_record(first, fields), debezium_record(later, fields, "u", 200)],
        "CREATE TABLE v (id int PRIMARY KEY, doc text, blob bytea, tags text[], v int, _df_position text)",
        "SELECT id, doc, blob, tags, v FROM v",
    )  # fmt: skip
    assert got == [(1, "x" * 10_000, b"\x00\x01\x02", ["a", "b"], 2)]


async def test_postgres_through_a_topic_to_postgres_copies_every_column_type(
    tansu: Tansu, postgres: Postgres
) -> None:
    """PostgreSQL → Kafka (debezium) → PostgreSQL: every column type the direct copy takes
    (``tests/test_postgres_sink.py``) arrives equal after the trip through JSON, NULLs, updates, a
    key moving and a delete included."""
    from tests.test_postgres_sink import EVERY_TYPE, TYPES_DDL, _reader_up, rows, target

    columns, names = ", ".join(f"{n} {t}" for n, t, _, _ in EVERY_TYPE), ", ".join(v[0] for v in EVERY_TYPE)
    source_db = await target(postgres, TYPES_DDL.format(columns=columns, extra=""))
    target_db = await target(postgres, TYPES_DDL.format(columns=columns, extra=", _df_position text"))
    values = [(", ".join(v[2] for v in EVERY_TYPE)), (", ".join(v[3] for v in EVERY_TYPE))]
    tansu.create_topic("pgrt.t", 1)
    source = {"type": "postgres", "config": {"id": "src", "dsn": postgres.dsn(source_db),
                                             "slot": f"s_{source_db}", "publication": f"p_{source_db}"}}  # fmt: skip
    async with running_both(relay("pgrt", source, tansu.bootstrap, postgres.dsn(target_db))) as runners:
        await wait_until(lambda: _reader_up(runners[0]), timeout=60, what="upstream reading")
        conn = await asyncpg.connect(postgres.dsn(source_db))
        await conn.execute(f"INSERT INTO t VALUES (1, '01:00', {values[0]}), (2, '02:00', {values[1]})")
        await conn.execute("INSERT INTO t (id, k) VALUES (3, '03:00'), (4, '04:00')")
        await conn.execute(f"UPDATE t SET ({names}) = (SELECT {names} FROM t WHERE id = 1) WHERE id = 3")
        await conn.execute("UPDATE t SET k = '05:00:00.25', iv = '1 minute' WHERE id = 2")
        await conn.execute("DELETE FROM t WHERE id = 4")
        await conn.close()
        await all_applied(runners, 7)
    query = f"SELECT id, k, {', '.join(f'{n}::text' for n, _, _, _ in EVERY_TYPE)} FROM t ORDER BY id"
    assert await rows(postgres.dsn(target_db), query) == await rows(postgres.dsn(source_db), query)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_records_of_a_compressed_topic_are_read_whatever_the_codec(
    tansu: Tansu, tmp_path: Path, codec: str
) -> None:
    """Producers compress record batches (deltaforge's own Kafka sink with ``compression``, or
    any other): aiokafka decompresses snappy, lz4 and zstd only with their Python libraries, and
    without them the source could not read such a topic at all."""
    topic = f"z{codec}"
    tansu.create_topic(topic, 1)
    p = Producer(
        {"bootstrap.servers": tansu.bootstrap, "compression.type": codec, "linger.ms": 5, "log_level": 3}
    )
    for i in range(50):
        p.produce(topic, b"v%d" % i, partition=0)
    assert p.flush(30) == 0
    values, runner = await _read_topic(tansu, topic, tmp_path, 50)
    assert runner.failure is None
    assert values == [f"v{i}" for i in range(50)]


async def test_a_debezium_postgres_rows_changes_are_ordered_by_lsn_across_partitions(
    tansu: Tansu, postgres: Postgres
) -> None:
    """Debezium's PostgreSQL connector (``connector: postgresql``) gives each change its WAL
    position (``lsn``). Its changes were ordered for ``if_newer`` by their offsets, which do not
    sort across partitions: once a topic is repartitioned, a row's newer change can sit at a lower
    offset in another partition, and the target kept the older value without a word."""
    topic = "pgdbz.public.v"
    tansu.create_topic(topic, 2)

    def change(v: int, lsn: int) -> bytes:
        source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pgdbz", "ts_ms": 1, "snapshot": "false",
                  "db": "app", "schema": "public", "table": "v", "txId": 700 + v, "lsn": lsn,
                  "sequence": f'["{lsn - 8}","{lsn}"]'}  # fmt: skip
        return orjson.dumps(
            {"before": None, "after": {"id": 1, "v": v}, "source": source, "op": "u", "ts_ms": 1}
        )

    # partition 0 holds v=1 at offset 2 (behind another row's two); the newer v=2, written after
    # the topic grew, sits at offset 0 of partition 1
    produce(tansu.bootstrap, [(topic, 0, b'{"id": 9}', change(0, 100)), (topic, 0, b'{"id": 9}', change(0, 120)),
                              (topic, 0, b'{"id": 1}', change(1, 200)), (topic, 1, b'{"id": 1}', change(2, 300))])  # fmt: skip
    pg = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(pg))
    await conn.execute("CREATE TABLE v (id int PRIMARY KEY, v int, _df_position text)")
    doc = pipeline("lsn", source_doc(tansu.bootstrap, [topic], "glsn", "debezium"),
                   [{"type": "postgres", "config": {"id": "p", "dsn": postgres.dsn(pg), "upsert_strategy": "if_newer"}}])  # fmt: skip
    runner = PipelineRunner(parse_pipeline(doc), store=MemoryCheckpointStore())
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: runner.ctx.stats.events_committed >= 4 or task.done(), timeout=60,
                         what="every record applied")  # fmt: skip
        assert runner.state == "running", runner.failure
    finally:
        await runner.drain()
        await task
    # whichever partition was read first, v=2 is the row's newer change
    assert [tuple(r) for r in await conn.fetch("SELECT id, v FROM v WHERE id = 1")] == [(1, 2)]
    await conn.close()
