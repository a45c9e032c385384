"""The Kafka source in-process (issue 19): positions over partitions, envelopes parsed back,
malformed records and config errors. Against a real broker: tests/test_kafka_source.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from deltaforge.config import ConfigError, parse_pipeline
from deltaforge.envelopes import cloudevents, debezium, native
from deltaforge.position import advance, earliest, not_held
from deltaforge.sources.kafka.position import KafkaPosition
from deltaforge.sources.kafka.records import Malformed, Record, RecordReader
from tests.test_kafka_source import pipeline, source_doc

# -- positions over partitions -------------------------------------------------------------


def at(offsets: dict[int, int], record: tuple[int, int] | None = None) -> KafkaPosition:
    return KafkaPosition(
        tuple(("t", p, o) for p, o in sorted(offsets.items())), ("t", *record) if record else None
    )


class _Ev:
    def __init__(self, part: int, offset: int, vector: dict[int, int]) -> None:
        self.checkpoint = at(vector, (part, offset))
        self.order = self.checkpoint.order


def test_a_sink_ahead_on_one_partition_skips_only_what_it_holds_after_a_resume() -> None:
    """Two sinks each ahead on another partition: reading resumes where both hold everything, and
    a replay interleaved differently gives each sink exactly what it lacks."""
    a, b = at({0: 10, 1: 4}), at({0: 6, 1: 8})
    resume = earliest([a, b])
    assert resume.offsets == (("t", 0, 6), ("t", 1, 4))
    # the replay: partition 1 first this time, then partition 0
    vector = {0: 6, 1: 4}
    replay = []
    for part, offset in [(1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (0, 6), (0, 7), (0, 8), (0, 9), (0, 10)]:
        vector[part] = offset + 1
        replay.append(_Ev(part, offset, dict(vector)))
    got_a = [(e.checkpoint.at[1], e.checkpoint.at[2]) for e in not_held(a, replay)]  # type: ignore[index]
    got_b = [(e.checkpoint.at[1], e.checkpoint.at[2]) for e in not_held(b, replay)]  # type: ignore[index]
    assert got_a == [(1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (0, 10)]
    assert got_b == [(1, 8), (0, 6), (0, 7), (0, 8), (0, 9), (0, 10)]
    end = replay[-1].checkpoint
    assert advance(a, end).offsets == advance(b, end).offsets == (("t", 0, 11), ("t", 1, 9))
    assert advance(a, at({0: 3, 1: 1})) is a  # nothing new: the position stays


def test_a_partition_one_sink_never_read_is_not_held_by_both() -> None:
    both = earliest([at({0: 5, 1: 2}), at({0: 7})])
    assert both.offsets == (("t", 0, 5),)  # partition 1: start over from the group's offset
    assert KafkaPosition.from_doc(both.to_doc()) == both


# -- envelopes parsed back -----------------------------------------------------------------


def _record(value: bytes | None, key: bytes | None = b'{"id": 7}', headers: tuple[Any, ...] = ()) -> Record:
    return Record("cdc.items", 2, 41, 1_700_000_000_000, key, value, headers)


def test_deltaforge_envelopes_come_back_as_the_changes_they_carry() -> None:
    from deltaforge.events import Event, SourceInfo
    from deltaforge.sources.mysql.position import BinlogPosition

    pos = BinlogPosition("mysql-bin.000003", 1234, 1, "0-1-9")
    original = Event("u", {"id": 7, "v": 1}, {"id": 7, "v": 2}, SourceInfo("mysql", "shop", "items", pos, 17,
                     None, ("id",)), "0-1-9", True, "3:1234:1", pos.order, pos, "acme")  # fmt: skip
    cp = at({2: 42}, (2, 41))
    for fmt, envelope in (("debezium", debezium), ("native", native), ("cloudevents", cloudevents)):
        value = orjson.dumps(envelope(original))
        key = b"acme|shop.items|0-1-9|3:1234:1"
        ev = RecordReader(fmt, "acme").event(_record(value, headers=(("idempotency_key", key),)), cp)
        assert ev is not None
        assert (ev.op, ev.before, ev.after) == ("u", original.before, original.after), fmt
        assert (ev.source.db, ev.source.table, ev.source.key) == ("shop", "items", ("id",)), fmt
        assert ev.idempotency_key == original.idempotency_key, fmt
        assert ev.order == pos.order, fmt  # if_newer compares upstream positions
        assert ev.checkpoint is cp


def test_a_tombstone_is_no_change_and_raw_records_are_kept_whole() -> None:
    cp = at({2: 42}, (2, 41))
    assert RecordReader("debezium", "acme").event(_record(None), cp) is None
    raw = RecordReader("raw", "acme").event(_record(b"\xff\x00", headers=(("h", b"v"),)), cp)
    assert raw is not None and raw.op == "c" and raw.after is not None
    assert raw.after["value"] == b"\xff\x00" and raw.after["key"] == '{"id": 7}'
    assert raw.after["headers"] == {"h": "v"} and raw.after["offset"] == 41
    gone = RecordReader("raw", "acme").event(_record(None), cp)
    assert gone is not None and gone.op == "d" and gone.before is not None and gone.before["value"] is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "a JSON list"),
        (b'{"op": "x", "after": {}}', "op is 'x'"),
        (b'{"op": "c", "after": null, "source": {"table": "t"}}', "without its after image"),
        (b'{"op": "c", "after": {"id": 1}}', "no source object"),
    ],
)
def test_a_record_not_in_the_declared_format_says_why(value: bytes, why: str) -> None:
    with pytest.raises(Malformed, match=why):
        RecordReader("debezium", "acme").event(_record(value), at({2: 42}, (2, 41)))


@pytest.mark.parametrize(
    ("topics", "said"),
    [(5, "expected a list of topic names or a /regex/, got 5"), ("/[unclosed/", "expected a valid /regex/")],
)
def test_a_wrong_topics_field_is_refused_naming_it(topics: Any, said: str) -> None:
    doc = pipeline("c", source_doc("127.0.0.1:9092", topics, "g", "raw"),
                   [{"type": "stdout", "config": {"id": "o"}}])  # fmt: skip
    with pytest.raises(ConfigError) as err:
        parse_pipeline(doc)
    assert "spec.source.config.topics" in str(err.value) and said in str(err.value)


def test_kafka_connects_logical_types_are_read_as_the_values_they_stand_for() -> None:
    """Every logical type Debezium and Kafka Connect write a time or number as (the PostgreSQL
    round trip in tests/test_kafka_source.py has the rest); a record without its schema, and a
    column the schema does not type, are left as they are."""
    from datetime import date, datetime, timedelta

    from deltaforge.sources.kafka.connect_types import typed_images

    names = {"ns": "io.debezium.time.NanoTimestamp", "nt": "io.debezium.time.NanoTime",
             "t": "io.debezium.time.Time", "kt": "org.apache.kafka.connect.data.Timestamp",
             "kd": "org.apache.kafka.connect.data.Date", "kti": "org.apache.kafka.connect.data.Time",
             "dur": "io.debezium.time.MicroDuration"}  # fmt: skip
    fields = [{"field": f, "type": "int64", "name": n} for f, n in names.items()] + [
        {"field": "plain", "type": "int64"}
    ]
    schema = {"fields": [{"field": "before", "fields": fields}, {"field": "after", "fields": fields}]}
    row = {"ns": 1_500_001_999, "nt": 3_600_000_000_001, "t": 61_000, "kt": -1000, "kd": 1, "kti": 1,
           "dur": -90_000_000, "plain": 5, "extra": "x"}  # fmt: skip
    got = typed_images(schema, {"op": "u", "before": row, "after": {**row, "ns": None}})
    want = {"ns": datetime(1970, 1, 1, 0, 0, 1, 500_001), "nt": timedelta(hours=1), "t": timedelta(seconds=61),
            "kt": datetime(1969, 12, 31, 23, 59, 59), "kd": date(1970, 1, 2), "kti": timedelta(milliseconds=1),
            "dur": timedelta(seconds=-90), "plain": 5, "extra": "x"}  # fmt: skip
    assert got == {"op": "u", "before": want, "after": {**want, "ns": None}}
    assert typed_images(None, {"after": row}) == {"after": row}
    days = {"field": "days", "type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}
    assert typed_images(
        {"fields": [{"field": "after", "fields": [days]}]}, {"after": {"days": [0, None, 366]}}
    ) == {"after": {"days": [date(1970, 1, 1), None, date(1971, 1, 2)]}}
