"""What the PostgreSQL decoder child makes of each change's Kafka record (``Event.made``: its
native envelope, record key and idempotency key) is what ``serve`` makes for that change itself,
byte for byte, against a real PostgreSQL.

The child makes the events of each frame with ``serve``'s code (frames.py) from the same opening
(connector, tenant, database, resets): these tests check the two stay alike where the events'
state moves (a transaction handed over in pieces, a key resolved from the catalog, a resumed
opening after a reset), for every kind of value and change the decoder hands on, and that a
disagreement, were there one, costs the child's records, not a row (the check itself, shared with
MySQL, is tests/test_mysql_child_envelopes.py's).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.envelopes import encode, native, row_key
from deltaforge.events import Event, Made
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.postgres.config import PostgresSourceConfig
from deltaforge.sources.postgres.source import PostgresSource
from tests.postgres_kit import TYPES, fresh_db, read_n, source
from tests.servers.postgres import Postgres
from tests.test_mysql_child_envelopes import records_alike


def own(e: Event) -> Made:
    """What serve makes of ``e``: the parts the child sends."""
    return encode(native(e)), row_key(e), e.idempotency_key.encode()


async def workload(conn: asyncpg.Connection) -> int:
    """Every kind of change and value the decoder hands on; returns how many changes."""
    await conn.execute(
        "INSERT INTO types VALUES (1, 9007199254740993, 12345678901234.123456, -2.5e100, 'héllo ✓ 😀', "
        "'\\x00ff10', true, '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.5+02', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, \"two\"]}', '{\"z\": null}', '{1,2,NULL}', "
        "'{\"a b\",c}', NULL)"
    )
    async with conn.transaction():  # a transaction over two tables
        await conn.execute("UPDATE types SET txt = 'changed', nul = 7 WHERE id = 1")
        await conn.execute("INSERT INTO other VALUES (1, 1)")
    await conn.execute("INSERT INTO other SELECT g, g FROM generate_series(2, 301) g")  # in pieces
    await conn.execute("UPDATE other SET id = id + 1000 WHERE id <= 3")  # the key moves: a key-only old row
    await conn.execute("INSERT INTO docs VALUES (1, repeat('x', 100000), 1)")
    await conn.execute("UPDATE docs SET n = 2 WHERE id = 1")  # the TOASTed body unchanged
    await conn.execute("DELETE FROM types WHERE id = 1")
    await conn.execute("DELETE FROM other WHERE id > 290")  # 291-301 and the three moved
    await conn.execute("TRUNCATE docs")
    return 1 + 2 + 300 + 3 + 2 + 1 + 14 + 1


async def test_each_change_carries_the_record_serve_would_make_for_it(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute(TYPES)
    await conn.execute("CREATE TABLE other (id int PRIMARY KEY, v int)")
    await conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)")
    await conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    await conn.execute("ALTER TABLE types REPLICA IDENTITY FULL")
    tables = ["public.types", "public.other", "public.docs"]
    src = source(postgres, db, tables=tables, read_chunk=50)
    src.native_envelopes = True
    await src.open(None)
    n = await workload(conn)
    events = await read_n(src, n)
    await src.close()
    assert len(events) == n and {e.op for e in events} == {"c", "u", "d", "t"}
    assert [e for e in events if e.made is None] == []
    assert [e.event_id for e in events if e.made != own(e)] == []
    moved = next(e for e in events if e.op == "u" and e.table == "other")
    assert moved.before == {"id": 1, "v": {"__not_logged__": True}}
    assert moved.made is not None and moved.made[1] == b'{"id":1001}'  # the key, from the catalog
    toast = next(e for e in events if e.op == "u" and e.table == "docs")
    assert toast.after == {"id": 1, "body": {"__unchanged_toast__": True}, "n": 2}
    records_alike([e for e in events if e.op != "t"])

    # Resumed from inside the pieces of the large transaction, after a reset (the event ids and
    # positions carry it): the child starts from the same opening as serve. The transaction is
    # read again whole (the sinks skip what their checkpoints hold).
    again = source(postgres, db, tables=tables, read_chunk=50)
    again.native_envelopes, again.resets = True, 1
    await again.open(events[100].checkpoint)
    replay = await read_n(again, n - 3)
    await again.close()
    await conn.close()
    assert replay[0].event_id.startswith("r1:") and replay[0].after == events[3].after
    assert [e for e in replay if e.made is None] == []
    assert [e.event_id for e in replay if e.made != own(e)] == []


async def test_without_a_native_sink_the_child_makes_no_records(postgres: Postgres) -> None:
    db = await fresh_db(postgres)
    conn = await asyncpg.connect(postgres.dsn(db))
    await conn.execute("CREATE TABLE other (id int PRIMARY KEY, v int)")
    src = source(postgres, db)
    await src.open(None)
    await conn.execute("INSERT INTO other VALUES (1, 1)")
    (event,) = await read_n(src, 1)
    await src.close()
    await conn.close()
    assert event.made is None and event.after == {"id": 1, "v": 1}


def test_a_record_other_than_serves_own_costs_the_childs_records_not_a_change() -> None:
    src = PostgresSource(PostgresSourceConfig(id="pg", dsn="postgres://u@127.0.0.1:1/app"), tenant="acme")
    src.txs.db = "app"
    txs = [
        (
            731,
            0x100,
            0x180,
            5_000_000,
            0x80,
            [("c", "public", "t", None, {"id": i}, ["id"]) for i in range(3)],
            0,
        )
    ]
    good = [own(e) for e in src.txs.events(txs)]
    with capture_logs() as logs:
        first = src._handle(("txs", txs, good))
        wrong = src._handle(("txs", txs, [(b"{}", *good[0][1:]), *good[1:]]))
        later = src._handle(("txs", txs, good))
    assert first is not None and [e.made for e in first] == good
    assert wrong is not None and later is not None and [e.made for e in wrong + later] == [None] * 6
    assert [e.after for e in wrong] == [{"id": i} for i in range(3)]  # every change, as it was
    assert [(entry["event"], entry["parts"]) for entry in logs] == [("child_envelope_mismatch", ["envelope"])]


def _doc(sinks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "p"},
        "spec": {
            "source": {"type": "postgres", "config": {"id": "pg", "dsn": "postgres://u@127.0.0.1:1/app"}},
            "sinks": sinks,
            "storage": {"type": "memory"},
        },
    }


def test_the_child_makes_records_for_a_kafka_sink_sending_the_native_envelope() -> None:
    kafka: dict[str, Any] = {"type": "kafka", "config": {"id": "k", "brokers": "127.0.0.1:1", "topic": "t"}}
    debezium = {"type": "kafka", "config": {**kafka["config"], "envelope": "debezium"}}
    assert PipelineRunner(parse_pipeline(_doc([kafka]), env={})).source.native_envelopes
    assert not PipelineRunner(parse_pipeline(_doc([debezium]), env={})).source.native_envelopes
