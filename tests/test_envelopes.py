"""Envelope encoding: a JSONL batch is each event's own envelope, line by line."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaforge.envelopes import ENVELOPES, encode, encode_lines, encoder, shape
from deltaforge.events import Event, SourceInfo
from tests.kit import SeqPosition, make_event


def _batch() -> list[Event]:
    """Rows sharing one origin (as a snapshot chunk's do), interrupted by others with their own."""
    shared = SourceInfo("postgres", "db", "items", SeqPosition(7), 1_700_000_000_000, "public", ("id",))
    other = SourceInfo("postgres", "db", "other", SeqPosition(9), 1_700_000_000_500, "public", ("id",))
    events = [replace(make_event(i), op="r", source=shared, tx_id="snapshot:initial:w1") for i in range(3)]
    events.append(replace(make_event(3), source=other))
    events.append(replace(make_event(4), op="r", source=shared, tx_id="snapshot:initial:w1"))
    events.append(make_event(5))  # its own SourceInfo, equal in value to none of the others
    events.append(replace(make_event(6), op="r", source=shared, event_id="w1:6:last"))
    return events


@pytest.mark.parametrize("envelope", ENVELOPES)
def test_a_batch_is_each_events_own_envelope_whichever_events_share_their_origin(envelope: str) -> None:
    events = _batch()
    one_by_one = [encode(shape(envelope)(e)) for e in events]
    lines = encode_lines(events, envelope).split(b"\n")
    assert lines[-1] == b""  # every line ends with a newline
    assert lines[:-1] == one_by_one
    docs = [orjson.loads(line) for line in lines[:-1]]
    sources = [d["data"]["source"] if envelope == "cloudevents" else d["source"] for d in docs]
    assert [s["table"] for s in sources] == ["items", "items", "items", "other", "items", "t", "items"]


@pytest.mark.parametrize("envelope", ENVELOPES)
def test_a_sinks_encoder_gives_each_event_its_own_envelope_across_batches(envelope: str) -> None:
    encode_one = encoder(envelope)  # one per sink, kept from batch to batch
    for batch in (_batch(), _batch()[::-1], _batch()):
        assert [encode_one(e) for e in batch] == [encode(shape(envelope)(e)) for e in batch]


_TEXT = st.lists(
    st.sampled_from(["a", "%", "%s", '"', "\\", "\x00", "é", "😀", ":last", "\n"]), max_size=4
).map("".join)
_VALUE = st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), _TEXT, st.binary(max_size=4), st.booleans(),
                   st.decimals(allow_nan=False, places=2), st.lists(st.integers(-9, 9), max_size=2))  # fmt: skip


@st.composite
def _runs(draw: st.DrawFn) -> list[Event]:
    """Runs of events sharing a ``SourceInfo`` (a snapshot chunk's rows), each field mostly the
    run's own and now and then another that an envelope shows; names and values with the
    characters encoding escapes."""

    def mostly(*choices: Any) -> Any:  # the first, three times in four
        return draw(st.sampled_from([choices[0]] * 3 * (len(choices) - 1) + list(choices[1:])))

    events: list[Event] = []
    for n in range(draw(st.integers(1, 4))):
        info = SourceInfo(
            "postgres", draw(_TEXT), draw(_TEXT), SeqPosition(n), 1_700_000_000_000 + n, "public"
        )
        for i in range(draw(st.integers(1, 8))):
            after = draw(st.none() | st.dictionaries(_TEXT, _VALUE, max_size=3))
            events.append(Event(
                op=mostly("r", "c", "d"), before=mostly(None, {"id": i}), after=after, source=info,
                tx_id=mostly("snapshot:initial:w", "snapshot:incremental:w", "%s"), tx_end=mostly(False, True),
                event_id=f"w:{i}" + mostly("", ":last", "%", '"'), order=(n, i), checkpoint=info.position,
                tenant=mostly("acme", "%s", "\x00"),
            ))  # fmt: skip
    return events


@settings(max_examples=200, deadline=None)
@given(_runs(), st.sampled_from(ENVELOPES))
def test_rows_of_one_origin_encode_as_each_events_own_envelope(events: list[Event], envelope: str) -> None:
    """Rows sharing their origin are encoded from a template from the second on: whatever they
    differ in and whatever their names and values hold, each line is the event's own envelope."""
    encode_one = encoder(envelope)
    assert [encode_one(e) for e in events] == [encode(shape(envelope)(e)) for e in events]
    lines = encode_lines(events, envelope)
    assert lines == b"".join(encode(shape(envelope)(e)) + b"\n" for e in events)


def test_an_unknown_envelope_is_refused_by_name() -> None:
    for make in (
        lambda: encode_lines([make_event(1)], "avro"),
        lambda: encoder("avro"),
        lambda: shape("avro"),
    ):
        with pytest.raises(ValueError, match="unknown envelope 'avro'; expected one of native, debezium"):
            make()
