"""Envelope encoding: a JSONL batch is each event's own envelope, line by line."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

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


def test_an_unknown_envelope_is_refused_by_name() -> None:
    for make in (
        lambda: encode_lines([make_event(1)], "avro"),
        lambda: encoder("avro"),
        lambda: shape("avro"),
    ):
        with pytest.raises(ValueError, match="unknown envelope 'avro'; expected one of native, debezium"):
            make()
