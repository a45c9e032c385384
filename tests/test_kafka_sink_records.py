"""What the Kafka sink makes of a batch's events (``RecordMaker``), record by record, without a
broker: keys of one column, of several and of none, a ``key`` template, tombstones, and an update
that moves its primary key. The real broker's side (partitions, tombstones read back, moves
replayed in order) is in tests/test_kafka_sink.py and tests/test_kafka_source.py."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaforge.config import parse_pipeline
from deltaforge.events import Event, Row, new_event, new_source_info
from deltaforge.sinks.kafka import KafkaSink
from deltaforge.sinks.kafka_records import RecordMaker
from tests.kit import SeqPosition, sink_pipeline


def maker(**settings: Any) -> RecordMaker:
    doc = sink_pipeline(
        "kr", "kafka", {"id": "k", "brokers": "127.0.0.1:1", "topic": "cdc.${source.table}", **settings}
    )
    return KafkaSink(parse_pipeline(doc, env={}).sinks[0]).records_of


def event(seq: int, op: str, before: Row | None, after: Row | None, key: tuple[str, ...]) -> Event:
    pos = SeqPosition(seq)
    src = new_source_info("mysql", "shop", "orders", pos, 1_700_000_000_000, None, key)
    return new_event(op, before, after, src, f"tx{seq}", True, str(seq), (seq,), pos, "default", 60)


KEYS = st.sampled_from([("id",), ("id", "region"), ()])
ROWS = st.fixed_dictionaries(
    {"id": st.integers(0, 3), "region": st.sampled_from(["eu", "us"]), "qty": st.integers(-(2**31), 2**31)}
)


@st.composite
def events(draw: st.DrawFn) -> list[Event]:
    out = []
    for seq in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from("crud"))
        before = draw(ROWS) if op in "ud" else None
        after = draw(ROWS) if op != "d" else None
        out.append(event(seq, op, before, after, draw(KEYS)))
    return out


def expected_key(e: Event) -> bytes | str:
    row = e.after if e.after is not None else e.before
    assert row is not None
    if e.source.key:
        return orjson.dumps({k: row[k] for k in e.source.key})
    return str(next(iter(row.values())))  # no key known: the first column


def moved(e: Event) -> bool:
    return e.op == "u" and bool(e.source.key) and any(e.before[k] != e.after[k] for k in e.source.key)  # type: ignore[index]


@settings(max_examples=150, deadline=None)
@given(batch=events(), tombstones=st.booleans())
def test_each_event_is_one_record_keyed_by_its_row_and_a_key_move_is_a_delete_then_a_create(
    batch: list[Event], tombstones: bool
) -> None:
    records = maker(tombstones=tombstones)(batch)
    got = iter(records)
    for e in batch:
        if not moved(e):
            topic, value, key, headers, tombstone = next(got)
            assert (topic, key, tombstone) == ("cdc.orders", expected_key(e), e.op == "d" and tombstones)
            assert headers == [
                ("idempotency_key", e.idempotency_key.encode()),
                ("event_id", e.event_id.encode()),
            ]
            doc = orjson.loads(value)
            assert (doc["op"], doc["before"], doc["after"]) == (e.op, e.before, e.after)
            continue
        (_, gone, old_key, gone_headers, gone_tomb), (_, came, new_key, came_headers, came_tomb) = (
            next(got),
            next(got),
        )
        assert old_key == orjson.dumps({k: e.before[k] for k in e.source.key})  # type: ignore[index]
        assert new_key == orjson.dumps({k: e.after[k] for k in e.source.key})  # type: ignore[index]
        assert gone_headers[1:] == [
            ("event_id", f"{e.event_id}:old".encode()),
            ("__debezium.newkey", new_key),
        ]
        assert came_headers[1:] == [("event_id", e.event_id.encode()), ("__debezium.oldkey", old_key)]
        assert (gone_tomb, came_tomb) == (tombstones, False)  # the old key's delete is compacted away
        assert [(d["op"], d["before"], d["after"]) for d in map(orjson.loads, (gone, came))] == [
            ("d", e.before, None),
            ("c", None, e.after),
        ]
    assert next(got, None) is None


def test_a_key_template_keys_every_record_and_a_key_move_stays_one_record() -> None:
    """With ``key`` set the user chose the partitioning: no Debezium key-move split."""
    e = event(1, "u", {"id": 1, "region": "eu", "qty": 1}, {"id": 2, "region": "us", "qty": 1}, ("id",))
    [(_, _, key, headers, _)] = maker(key="${after.region}")([e])
    assert key == "us"
    assert [name for name, _ in headers] == ["idempotency_key", "event_id"]


def test_a_topic_from_source_fields_is_checked_when_first_made_and_an_illegal_one_every_time() -> None:
    """``cdc.${source.table}`` keeps each table's topic once it is found legal; a table whose
    name makes an illegal topic is refused on every event (poison, ``routing``), never kept."""
    from dataclasses import replace

    import pytest

    from deltaforge.sinks.kafka_names import IllegalTopic, topic_renderer
    from tests.kit import make_event

    render = topic_renderer("cdc.${source.table}", "k")
    good = make_event(1)
    bad = replace(good, source=replace(good.source, table="east coast"))
    assert [render(good), render(good)] == ["cdc.t", "cdc.t"]
    for _ in range(3):
        with pytest.raises(
            IllegalTopic, match=r"topic 'cdc\.east coast' is not a legal Kafka topic name"
        ) as refused:
            render(bad)
        assert refused.value.kind == "routing"
    assert render(good) == "cdc.t"
