"""What the MySQL decoder child makes of each change's Kafka record (``Event.made``: its native
envelope, record key and idempotency key) is what ``serve`` makes for that change itself, byte for
byte, and a Kafka sink sends it as it is: its records are the ones it would build itself.

The child makes the events of each frame with the same code as ``serve`` (txevents.py), from the
same opening: these tests check that the two stay alike where their state moves (GTID state
across transactions, a transaction handed over in pieces, a resumed opening, a failover
generation), and that a disagreement, were there one, costs the child's envelopes, not a row.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.envelopes import encode, encoder, native, row_key
from deltaforge.events import Event, Made
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.kafka_names import topic_renderer
from deltaforge.sinks.kafka_records import RecordMaker
from deltaforge.sinks.templates import compile_template
from deltaforge.sources.made import without_made
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.source import MySQLSource
from tests.kit import make_event
from tests.mysql_kit import fresh_db, read_n, source
from tests.servers.mariadb import MariaDB
from tests.test_mysql_source import TYPES_DDL


def workload(server: MariaDB, db: str) -> int:
    """Every kind of change and value the decoder hands on; returns how many changes."""
    with server.root(db) as c, c.cursor() as cur:
        cur.execute(
            "INSERT INTO types VALUES (1, 9007199254740993, -5, 12345678.1234, 1.5, -2.25e100, 'héllo ✓ 😀', "
            "REPEAT('t', 300), x'00ff10', '2024-02-29', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.500', "
            "'{\"k\": [1, \"two\"]}', 'green', 'a,c', NULL)"
        )
        c.begin()  # a transaction over two tables
        cur.execute("UPDATE types SET vc = 'changed', nul = 7 WHERE id = 1")
        cur.execute("INSERT INTO other VALUES (1, 1)")
        c.commit()
        c.begin()  # larger than read_chunk: handed over in pieces
        cur.executemany("INSERT INTO other VALUES (%s, %s)", [(i, i) for i in range(2, 302)])
        c.commit()
        cur.execute("UPDATE other SET id = id + 1000 WHERE id <= 3")  # the primary key moves
        cur.execute("DELETE FROM types WHERE id = 1")
        cur.execute("DELETE FROM other WHERE id > 290")  # 291-301 and the three moved
    return 1 + 2 + 300 + 3 + 1 + 14


def own(e: Event) -> Made:
    """What serve makes of ``e``: the parts the child sends."""
    return encode(native(e)), row_key(e), e.idempotency_key.encode()


def records_alike(events: list[Event]) -> None:
    """A Kafka sink's records for ``events`` are the ones it builds for the same events with nothing
    made by the child: default key, a key template, tombstones, the key moves' pairs."""
    for key, tombstones in ((None, True), ("${source.table}-${after.id}", False)):
        make = RecordMaker(topic_renderer("cdc.${source.table}", "k"), encoder("native"),
                           compile_template(key) if key else None, tombstones)  # fmt: skip
        assert make(events) == make(without_made(events))


async def test_each_change_carries_the_record_serve_would_make_for_it(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(TYPES_DDL.format(db=db))
        cur.execute(f"CREATE TABLE {db}.other (id INT PRIMARY KEY, v INT)")
    src = source(mariadb, [f"{db}.types", f"{db}.other"], read_chunk=50)
    src.native_envelopes = True
    await src.open(None)
    n = workload(mariadb, db)
    events = await read_n(src, n)
    await src.close()
    assert len(events) == n and len({e.tx_id for e in events}) == 6
    assert [e for e in events if e.made is None] == []
    assert [e.event_id for e in events if e.made != own(e)] == []
    assert orjson.loads(events[0].made[0] if events[0].made else b"")["after"]["bl"] == "AP8Q"  # base64
    assert events[0].made is not None and events[0].made[1] == b'{"id":1}'  # the primary key, as JSON
    records_alike(events)

    # Resumed from inside the pieces of the large transaction, in a later failover generation:
    # the child starts from the checkpoint's GTID state, as serve does.
    resume = events[100].checkpoint
    again = source(mariadb, [f"{db}.types", f"{db}.other"], read_chunk=50)
    again.native_envelopes, again.generation = True, 1
    await again.open(resume)
    replay = await read_n(again, n - 3)  # the first whole transactions are not read again
    await again.close()
    assert replay[0].event_id.startswith("g1:") and replay[-1].source.position.gen == 1
    assert [e for e in replay if e.made is None] == []
    assert [e.event_id for e in replay if e.made != own(e)] == []
    records_alike(replay)


async def test_without_a_native_sink_the_child_makes_no_envelopes(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.other (id INT PRIMARY KEY, v INT)")
    src = source(mariadb, [f"{db}.other"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO other VALUES (1, 1)")
    (event,) = await read_n(src, 1)
    await src.close()
    assert event.made is None and event.after == {"id": 1, "v": 1}


def _frame_of(n: int) -> tuple[Any, ...]:
    rows = [("c", "db", "t", 100 + i, 0, 1_700_000_000, None, {"id": i}) for i in range(n)]
    return ("txs", [("0-1-7", "0-1-7", "mysql-bin.000001", 900, 50, rows)])


@pytest.mark.parametrize("part", [0, 1, 2], ids=["envelope", "key", "idempotency_key"])
def test_a_record_other_than_serves_own_is_dropped_with_every_later_one_and_said(part: int) -> None:
    """Were the two sides' states ever to differ, serve finds it at the frame's first change:
    that frame's events and every later frame's lose what the child made (the sinks make their
    own) and an error says which part differed; no event is lost."""
    src = MySQLSource(MySQLSourceConfig(id="my", dsn="mysql://u@127.0.0.1:1/db", tables=["db.t"]))
    src._txs.keys["db.t"] = ("id",)
    good = [own(e) for e in src._txs(_frame_of(3)[1])]
    src._txs.committed = ""
    bad = list(good[0])
    bad[part] = b'{"id":"x"}'
    with capture_logs() as logs:
        first = src._handle((*_frame_of(3), good))
        assert first is not None and [e.made for e in first] == good
        src._txs.committed = ""  # the same frame again: the same events, but for the one part
        wrong = src._handle((*_frame_of(3), [tuple(bad), *good[1:]]))
        later = src._handle((*_frame_of(3), good))
    assert wrong is not None and later is not None
    assert [e.made for e in wrong + later] == [None] * 6
    assert [e.after for e in wrong] == [{"id": i} for i in range(3)]  # every change, as it was
    assert [(entry["event"], entry["parts"]) for entry in logs] == [
        ("child_envelope_mismatch", [["envelope", "key", "idempotency_key"][part]])
    ]


def test_a_native_sink_sends_the_childs_envelope_and_other_envelopes_ignore_it() -> None:
    made = b'{"op":"c","made":"in the child"}'
    e = make_event(1)
    e = Event(*(getattr(e, f) for f in Event.__slots__[:-1]), (made, b"k", b"i"))  # type: ignore[arg-type]
    assert encoder("native")(e) == made
    assert encoder("native", lines=True)(e) == made + b"\n"
    assert orjson.loads(encoder("debezium")(e))["after"] == e.after
    assert orjson.loads(encoder("cloudevents")(e))["data"]["after"] == e.after
    record = RecordMaker(lambda _: "t", encoder("native"), None, False)([e])
    assert record == [("t", made, b"k", [("idempotency_key", b"i"), ("event_id", b"1")], False)]
    templated = RecordMaker(lambda _: "t", encoder("native"), compile_template("${after.id}"), False)([e])
    assert templated[0][2] == "1"  # the sink's key template names the key, not the child
    plain = make_event(2)  # no envelope made: the sink makes it
    assert encoder("native")(plain) == encode(native(plain))


@pytest.mark.parametrize(
    ("sinks", "made"),
    [
        ([{"type": "kafka", "config": {"id": "k", "brokers": "127.0.0.1:1", "topic": "t"}}], True),
        ([{"type": "kafka", "config": {"id": "k", "brokers": "127.0.0.1:1", "topic": "t", "envelope": "debezium"}}],
         False),
        ([{"type": "file", "config": {"id": "f", "path": "/dev/null"}}], False),  # the child would be the bound
    ],
)  # fmt: skip
def test_the_child_makes_envelopes_only_for_a_kafka_sink_sending_the_native_one(
    sinks: list[dict[str, Any]], made: bool
) -> None:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "p"},
        "spec": {
            "source": {
                "type": "mysql",
                "config": {"id": "my", "dsn": "mysql://u@127.0.0.1:1/db", "tables": ["db.t"]},
            },
            "sinks": sinks,
            "storage": {"type": "memory"},
        },
    }
    runner = PipelineRunner(parse_pipeline(doc, env={}))
    assert runner.source.native_envelopes is made
