"""The pgoutput decoder: real messages decode; corrupt bytes raise DecodeError naming the LSN."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaforge.sources.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Change,
    Commit,
    DecodeError,
    Relation,
    Truncate,
    decode,
    format_lsn,
    parse_lsn,
)
from deltaforge.sources.postgres.rows import row, row_builder
from deltaforge.sources.postgres.values import Types, converter, parse_array


def tup(*vals: object) -> bytes:
    out = struct.pack(">h", len(vals))
    for v in vals:
        if v is None:
            out += b"n"
        elif v is UNCHANGED_TOAST:
            out += b"u"
        else:
            b = str(v).encode()
            out += b"t" + struct.pack(">i", len(b)) + b
    return out


SAMPLES = [
    b"B" + struct.pack(">QqI", 0x16B3748, 700_000_000_000_000, 731),
    b"C" + b"\0" + struct.pack(">QQq", 0x16B3748, 0x16B3790, 700_000_000_000_000),
    b"R"
    + struct.pack(">I", 16384)
    + b"public\0orders\0d"
    + struct.pack(">h", 2)
    + b"\x01id\0"
    + struct.pack(">Ii", 23, -1)
    + b"\x00note\0"
    + struct.pack(">Ii", 25, -1),
    b"I" + struct.pack(">I", 16384) + b"N" + tup(1, "hello"),
    b"U" + struct.pack(">I", 16384) + b"O" + tup(1, "hello") + b"N" + tup(1, UNCHANGED_TOAST),
    b"D" + struct.pack(">I", 16384) + b"K" + tup(1, None),
    b"T" + struct.pack(">iB", 2, 0) + struct.pack(">II", 16384, 16385),
    b"O" + struct.pack(">Q", 5) + b"origin\0",
    b"Y" + struct.pack(">I", 99) + b"public\0mytype\0",
]


def test_decodes_every_message_type() -> None:
    msgs = [decode(m, 1) for m in SAMPLES]
    assert msgs[0] == Begin(0x16B3748, 700_000_000_000_000, 731)
    assert msgs[1] == Commit(0x16B3748, 0x16B3790, 700_000_000_000_000)
    rel = msgs[2]
    assert isinstance(rel, Relation) and rel.name == "orders" and rel.namespace == "public"
    assert [(c.name, c.type_oid, c.key) for c in rel.columns] == [("id", 23, True), ("note", 25, False)]
    assert msgs[3] == Change("c", 16384, None, ["1", "hello"])
    upd = msgs[4]
    assert isinstance(upd, Change) and upd.old == ["1", "hello"] and upd.new == ["1", UNCHANGED_TOAST]
    assert msgs[5] == Change("d", 16384, ["1", None], None, key_only=True)
    assert msgs[6] == Truncate((16384, 16385), 0)


def test_truncated_messages_raise_decode_error_naming_the_lsn() -> None:
    for m in SAMPLES:
        for cut in range(len(m)):
            with pytest.raises(DecodeError, match="at LSN 0/16B3748"):
                decode(m[:cut], 0x16B3748)


def test_lsn_text_round_trip() -> None:
    assert parse_lsn("16/B374D848") == 0x16B374D848
    assert format_lsn(0x16B374D848) == "16/B374D848"


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_never_crash(data: bytes) -> None:
    try:
        decode(data, 42)
    except DecodeError as exc:
        assert "LSN 0/2A" in str(exc)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_mutated_messages_never_crash(msg: bytes, data: st.DataObject) -> None:
    buf = bytearray(msg)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(buf), 7)
    except DecodeError:
        pass


NAMES = st.sampled_from(
    ["id", "v", "a b", "'", '"', "values", "v0", "_k0", "_c1", "_T", "_row", "build", "é"]
)
CONVERSIONS = st.sampled_from([None, str.upper, len, lambda s: s[::-1]])
VALUES = st.one_of(st.none(), st.just(UNCHANGED_TOAST), st.text(max_size=5), st.binary(max_size=3))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(NAMES, CONVERSIONS), max_size=6, unique_by=lambda c: c[0]), st.data())
def test_a_relations_row_builder_makes_the_rows_the_generic_loop_makes(
    columns: list[tuple[str, object]], data: st.DataObject
) -> None:
    """The decoder makes each relation's rows with code written for its columns (once per Relation
    message): for any names (the generated code's own among them), conversions and values (null,
    unchanged TOAST, text, binary), and a tuple of another length, the rows are the loop's."""
    names, convs = [c[0] for c in columns], [c[1] for c in columns]
    build = row_builder(names, convs)
    n = data.draw(st.sampled_from([len(names), len(names), max(0, len(names) - 1), len(names) + 1]))
    values = data.draw(st.lists(VALUES, min_size=n, max_size=n))
    assert build(values) == row(names, convs, values)
    toast = [name for name, v in zip(names, values, strict=False) if v is UNCHANGED_TOAST]
    assert all(build(values)[name] is not build(values)[name] for name in toast)  # a marker each, not shared


def test_text_values_convert_by_type() -> None:
    assert converter(16)("t") is True
    assert converter(17)("\\x00ff") == b"\x00\xff"
    assert converter(1007)("{1,2,NULL}") == [1, 2, None]
    assert converter(1009)('{"a b",c,"q\\"x"}') == ["a b", "c", 'q"x']
    assert parse_array("{{1,2},{3,4}}", int) == [[1, 2], [3, 4]]
    assert converter(3802)('{"k": [1, 2]}') == {"k": [1, 2]}
    assert str(converter(1184)("2024-01-02 03:04:05.5+00")) == "2024-01-02 03:04:05.500000+00:00"
    assert converter(2950)("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11") == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"


def test_types_the_catalog_leaves_unanswered_are_text_and_never_asked_again() -> None:
    """A domain over a domain over ``int``, and an array of it, read as their base type; an OID
    the catalog does not answer for (a type dropped since the column named it) is text, and is
    not missing any more (the lookup loop ends). Those in SCALARS and ARRAYS are never asked."""
    types = Types()
    assert types.missing([16, 1007, 90001]) == [90001]
    types.learn([90001], [(90001, True, 90002, 0, False)])
    assert types.missing([90001]) == [90002]
    types.learn([90002], [(90002, True, 23, 0, False)])
    assert types.missing([90001, 90003]) == [90003]
    types.learn([90003, 90004], [(90003, False, 0, 90001, True)])  # 90004: not answered
    assert types.missing([90001, 90003, 90004]) == []
    assert types.converter(90001)("5") == 5
    assert types.converter(90003)("{5,NULL}") == [5, None]
    assert types.converter(90004)("{5}") == "{5}"
