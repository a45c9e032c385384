"""A MariaDB snapshot row carries the values a change of that row carries, type for type, as
JSON: a consumer cannot tell a row it got from a snapshot from one it got from the binlog by its
values (the PostgreSQL twin: ``tests/test_snapshot_postgres.py``). Where python-mysql-replication
gave a value otherwise, the binlog's side was set right (``rowvalues.Retyped``, ``as_utc``), or,
for FLOAT, whose text has six digits, the snapshot's (``snapshot.py``)."""

from __future__ import annotations

import ipaddress
import random
import struct
import uuid
from datetime import date, datetime, timedelta

import orjson
from hypothesis import given
from hypothesis import strategies as st

from deltaforge.envelopes import json_default
from deltaforge.events import Row
from deltaforge.sources.mysql.rowvalues import short_float
from deltaforge.sources.mysql.snapshot import MySQLChunks
from tests.mysql_kit import read_n, source
from tests.servers.mariadb import MariaDB
from tests.test_mysql_json_chunks import EVERY_TYPE, ROWS, prepare, read_all

F32 = struct.Struct("<f")

MORE = [  # what python-mysql-replication gave otherwise than a snapshot, and its neighbours
    "(5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "16777215, NULL, NULL, NULL, 'y,x', x'ff000000', x'ff00', x'00')",
    "(6, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "123456.789, NULL, NULL, NULL, 'y', x'00000001', x'0000', NULL)",
    "(7" + ", NULL" * 17 + ", 3.4028234e38, NULL, NULL, NULL, NULL, x'00', NULL, NULL)",
]


def as_json(rows: list[Row]) -> list[dict[str, bytes]]:
    """Each value as a sink's JSON has it."""
    return [{k: orjson.dumps(v, default=json_default) for k, v in r.items()} for r in rows]


async def snapshot_both_ways(server: MariaDB, db: str) -> tuple[list[Row], list[Row]]:
    reader = MySQLChunks(source(server, [f"{db}.t"]), f"{db}.signal")
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"{db}.t"])
        by_json = await read_all(reader, ref, 3)
        assert reader.known[ref.name].json is not None, "the table was not read as JSON"
        reader.known[ref.name].json = None
        plain = await read_all(reader, ref, 3)
    finally:
        await reader.close()
    return by_json, plain


async def test_a_snapshot_row_carries_the_values_a_change_of_the_row_carries(mariadb: MariaDB) -> None:
    db = prepare(mariadb, EVERY_TYPE, [])
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        for r in ROWS + MORE:
            cur.execute(f"INSERT INTO t VALUES {r}")
        # An update's two images: a set emptied, a zero date given a day, padding moved.
        cur.execute("UPDATE t SET s = '', d = '2024-01-01', bn = x'00ff0000' WHERE id = 1")
    events = await read_n(src, len(ROWS + MORE) + 1)
    await src.close()
    inserted, [update] = events[:-1], events[-1:]
    by_json, plain = await snapshot_both_ways(mariadb, db)

    final = {r["id"]: r for r in (e.after for e in inserted) if r is not None}
    assert update.before == final[1] and update.after is not None
    final[1] = update.after
    streamed = as_json([final[r["id"]] for r in plain])
    assert streamed == as_json(plain) == as_json(by_json)
    row = {r["id"]: r for r in plain}
    assert (row[1]["s"], row[2]["s"], row[3]["s"], row[5]["s"]) == ("", "", None, "x,y")
    assert (row[2]["bn"], row[5]["bn"], row[6]["bn"]) == (b"\0\0\0\0", b"\xff\0\0\0", b"\0\0\0\x01")
    assert (row[5]["fl"], row[6]["fl"], row[7]["fl"]) == (16777215.0, 123456.79, 3.4028235e38)
    assert (row[4]["d"], row[4]["dtm"], row[4]["ts"]) == (None, None, None)  # zero dates
    assert update.before["s"] == "x,y" and update.after["s"] == "" and update.after["bn"] == b"\0\xff\0\0"


async def test_random_floats_come_as_the_same_shortest_number_either_way(mariadb: MariaDB) -> None:
    """FLOAT's text has six digits: a snapshot of 16777215 read 16777200. Both ways now give the
    shortest decimal that reads back as the stored 32-bit float, seeded across its range."""
    rng = random.Random(1851)
    stored = [
        F32.unpack(F32.pack(x))[0]
        for x in (rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30) for _ in range(300))
    ]
    db = prepare(mariadb, "CREATE TABLE t (id INT PRIMARY KEY, f FLOAT)", [])
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"GRANT CREATE, INSERT, UPDATE ON {db}.* TO 'cdc'@'%'")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s)", list(enumerate(stored)))
    streamed = [e.after for e in await read_n(src, len(stored)) if e.after is not None]
    await src.close()
    by_json, plain = await snapshot_both_ways(mariadb, db)
    assert as_json(streamed) == as_json(plain) == as_json(by_json)
    for r in plain:
        assert F32.pack(r["f"]) == F32.pack(stored[r["id"]])  # nothing lost
        assert significant(r["f"]) <= 9


def significant(x: float) -> int:
    """The significant digits of ``x`` as Python writes it (``16777215.0``: 8)."""
    return len(repr(abs(x)).split("e")[0].replace(".", "").strip("0")) or 1


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_short_float_reads_back_as_the_same_float_in_the_fewest_digits(value: float) -> None:
    short = short_float(value)
    assert F32.pack(short) == F32.pack(value)
    digits = significant(short)
    assert digits <= 9
    assert digits == 1 or F32.pack(float(f"{value:.{digits - 1}g}")) != F32.pack(value)


OTHER_TYPES = """CREATE TABLE t (id INT PRIMARY KEY, b3 BIT(3), b12 BIT(12), b1 BIT(1), g POINT, e ENUM('a','b'),
    c CHAR(4), tt TINYTEXT, tu TINYINT UNSIGNED, mu MEDIUMINT UNSIGNED, t0 TIME, y YEAR, dneg DECIMAL(5,2),
    f2 FLOAT(7,3))"""


async def test_a_table_read_plainly_carries_the_values_a_change_carries(mariadb: MariaDB) -> None:
    """Types that keep a table off the JSON read (BIT, spatial), and their neighbours: BIT came
    from the binlog as a string of bits (``'101'``), and the year 0000 as 1900."""
    db = prepare(mariadb, OTHER_TYPES, [])
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # so that a wrong ENUM value is stored as ''
        cur.execute(
            "INSERT INTO t VALUES (1, b'101', b'100000000001', b'1', ST_GeomFromText('POINT(1 2)'), 'b', 'ab  ', "
            "'x', 255, 16777215, '-12:30:00', 0, -1.5, 1234.567)"
        )
        cur.execute("INSERT INTO t VALUES (2, 0, 0, 0, NULL, 'zzz', '', '', 0, 0, '00:00:00', 2155, 0, 0)")
        cur.execute("INSERT INTO t (id) VALUES (3)")
    streamed = [e.after for e in await read_n(src, 3) if e.after is not None]
    await src.close()
    reader = MySQLChunks(source(mariadb, [f"{db}.t"]), f"{db}.signal")
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"{db}.t"])
        assert reader.known[ref.name].json is None  # BIT and POINT: read plainly
        plain = await read_all(reader, ref, 2)
    finally:
        await reader.close()
    assert as_json(streamed) == as_json(plain)
    assert (plain[0]["b3"], plain[0]["b12"], plain[1]["b3"]) == (b"\x05", b"\x08\x01", b"\x00")
    assert (plain[0]["y"], plain[1]["y"], plain[1]["e"]) == (0, 2155, "")


def uuids(rng: random.Random) -> list[str]:
    """Seeded UUIDs of every version and variant MariaDB takes, among them the time-based ones
    it stores with their segments swapped (version 1-5 with the RFC variant), and both ends of
    the range. It refuses a version from 8 up with a variant below 8 (the stored form of a
    swapped one)."""
    out = {"00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"}
    while len(out) < 200:
        b = bytearray(rng.randbytes(16))
        b[6] = (rng.randint(0, 15) << 4) | (b[6] & 0x0F)  # the version nibble, any
        if b[6] >= 0x80 and b[8] < 0x80:
            continue
        out.add(str(uuid.UUID(bytes=bytes(b))))
    return sorted(out)


INET6_EDGES = [
    "::", "::1", "1::", "::1.2.3.4", "::ffff:1.2.3.4", "::ffff:0:1.2.3.4", "::fffe:1.2.3.4", "1:0:2:3:4:5:6:7",
    "1:0:0:2:0:0:3:4", "0:0:1:0:0:0:2:3", "2001:db8::1", "fe80::1:0:0:0", "::0.0.0.1", "::ffff:0.0.0.0",
    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
]  # fmt: skip


def inet6s(rng: random.Random) -> list[str]:
    """Seeded IPv6 addresses whose groups are zero half the time (zero runs of every length and
    place, ties among them), and the edges of MariaDB's text: IPv4-compatible and -mapped."""
    out = set(INET6_EDGES)
    while len(out) < 200:
        words = [
            0 if rng.random() < 0.5 else rng.choice([1, 0xFFFF, rng.randint(1, 0xFFFF)]) for _ in range(8)
        ]
        out.add(str(ipaddress.IPv6Address(b"".join(w.to_bytes(2, "big") for w in words))))
    return sorted(out)


async def test_mariadbs_uuid_and_inet_types_are_their_text_whether_streamed_or_snapshotted(
    mariadb: MariaDB,
) -> None:
    """The binlog names no type for MariaDB's UUID, INET4 and INET6 (a table map gives them as
    BINARY(16), BINARY(4)): a change carried their stored bytes, a snapshot their text, so a
    UUID key keyed a row's change apart from its snapshot record. Both are now the server's
    text, a UUID key included; a BINARY(16) or BINARY(4) column stays bytes."""
    rng = random.Random(1907)
    keys, v6 = uuids(rng), inet6s(rng)
    rows = [
        (u, ".".join(str(rng.randint(0, 255)) for _ in range(4)), v6[i], rng.randbytes(16), rng.randbytes(4))
        for i, u in enumerate(keys)
    ]
    db = prepare(
        mariadb, "CREATE TABLE t (u UUID PRIMARY KEY, i4 INET4, i6 INET6, b16 BINARY(16), b4 BINARY(4))", []
    )
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s)", rows)
        cur.execute("INSERT INTO t VALUES ('01234567-89ab-1def-8123-456789abcdef', NULL, NULL, NULL, NULL)")
        cur.execute("UPDATE t SET i6 = '::ffff:10.0.0.1' WHERE u = %s", (keys[1],))
        cur.execute("DELETE FROM t WHERE u = '01234567-89ab-1def-8123-456789abcdef'")
    events = await read_n(src, len(rows) + 3)
    await src.close()
    by_json, plain = await snapshot_both_ways(mariadb, db)

    final: dict[str, Row] = {}
    for e in events:
        if e.op == "d":
            assert e.before is not None
            del final[e.before["u"]]
        else:
            assert e.after is not None
            final[e.after["u"]] = e.after
    assert [r["u"] for r in plain] != sorted(r["u"] for r in plain)  # the server's UUID order
    assert as_json([final[r["u"]] for r in plain]) == as_json(plain) == as_json(by_json)
    assert sorted(final) == keys
    update, delete = events[-2:]
    assert update.before is not None and update.after is not None and delete.before is not None
    assert (update.before["u"], update.after["i6"]) == (keys[1], "::ffff:10.0.0.1")
    assert delete.before == {
        "u": "01234567-89ab-1def-8123-456789abcdef",
        "i4": None,
        "i6": None,
        "b16": None,
        "b4": None,
    }
    row = {r["u"]: r for r in plain}
    assert {row[u]["i6"] for u in keys[2:]} >= {
        "::",
        "::1.2.3.4",
        "::ffff:1.2.3.4",
        "1::2:3:4:5:6:7",
        "1::2:0:0:3:4",
    }
    assert all(isinstance(r["b16"], bytes) and isinstance(r["b4"], bytes) for r in plain)


async def test_a_negative_time_with_a_fraction_is_the_time_stored(mariadb: MariaDB) -> None:
    """MySQL stores a TIME below zero as the two's complement of the whole value, fraction
    included; python-mysql-replication complemented the seconds alone, so ``-00:00:01.25`` came
    out of the binlog as ``-00:00:01.75`` (a snapshot read it right). Seeded values across the
    range at every precision, and the edges around zero, come the same both ways."""
    rng = random.Random(1913)
    edges = ["-00:00:00.000001", "-00:00:00.5", "-00:00:01.25", "-00:59:59.999999", "-838:59:58.999999",
             "-838:59:59", "00:00:00.000001", "-00:00:01"]  # fmt: skip
    values = edges + [
        f"{rng.choice('-+')}{rng.randint(0, 837)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        f".{rng.randint(0, 999_999):06d}"
        for _ in range(300)
    ]
    columns = ", ".join(f"t{n} TIME({n})" for n in range(7))
    db = prepare(mariadb, f"CREATE TABLE t (id INT PRIMARY KEY, {columns})", [])
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.executemany(
            "INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(i, *[v] * 7) for i, v in enumerate(values)],
        )
    streamed = [e.after for e in await read_n(src, len(values)) if e.after is not None]
    await src.close()
    by_json, plain = await snapshot_both_ways(mariadb, db)
    assert as_json(streamed) == as_json(plain) == as_json(by_json)
    assert [plain[i]["t6"] for i in range(3)] == [
        timedelta(microseconds=-1),
        timedelta(microseconds=-500_000),
        timedelta(seconds=-1, microseconds=-250_000),
    ]


CHARSETS = """CREATE TABLE t (id INT PRIMARY KEY, l1 TEXT CHARACTER SET latin1, u16 VARCHAR(40) CHARACTER SET utf16,
    u16le VARCHAR(40) CHARACTER SET utf16le, u32 VARCHAR(40) CHARACTER SET utf32, uc2 VARCHAR(40) CHARACTER SET ucs2,
    cy VARCHAR(40) CHARACTER SET cp1251, gb VARCHAR(40) CHARACTER SET gbk, sj VARCHAR(40) CHARACTER SET sjis,
    k8 VARCHAR(40) CHARACTER SET koi8r, l2 VARCHAR(40) CHARACTER SET latin2, el VARCHAR(40) CHARACTER SET greek,
    u3 VARCHAR(40) CHARACTER SET utf8mb3, e1 ENUM('café', 'b') CHARACTER SET latin1, s1 SET('é', 'x') CHARACTER SET latin1,
    ec ENUM('ж', 'y') CHARACTER SET cp1251, e8 ENUM('ü✓', '😀') CHARACTER SET utf8mb4)"""


async def test_text_in_any_character_set_is_the_text_stored(mariadb: MariaDB) -> None:
    """python-mysql-replication named MySQL's character sets as Python codecs: utf16, utf32 and
    ucs2 read little-endian (MySQL's are big-endian: mojibake, or the stream stopped), ucs2 and
    utf16le as bytes, latin1 as Python's cp1252, which refuses the five bytes MySQL maps to
    control characters (common where latin1 columns hold UTF-8 bytes: the stream stopped), and
    ENUM and SET members outside UTF-8 as ``''``. Every value now comes the same both ways; the
    latin1 column holds every byte from 0x80 up."""
    db = prepare(mariadb, CHARSETS, [])
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    texts = ["😀 ok", "😀 ok", "😀 ok", "ü ok", "привет", "中文", "ｱｲ", "привет", "žluť", "λόγος", "ü✓"]
    with mariadb.root(db) as c, c.cursor() as cur:
        high = bytes(range(0x80, 0x100)).hex()
        cur.execute(
            f"INSERT INTO t VALUES (1, _latin1 x'{high}', {', '.join(['%s'] * 11)}, 'café', 'é,x', 'ж', '😀')",
            texts,
        )
        cur.execute(
            f"INSERT INTO t VALUES (2, _latin1 x'c381c39d', {', '.join(['%s'] * 11)}, 'b', '', 'y', 'ü✓')",
            ["a"] * 11,
        )
        cur.execute("UPDATE t SET u32 = 'x😀y', e1 = 'café' WHERE id = 2")
    events = await read_n(src, 3)
    await src.close()
    by_json, plain = await snapshot_both_ways(mariadb, db)
    final = {e.after["id"]: e.after for e in events if e.after is not None}
    assert events[2].before is not None and events[2].before["e1"] == "b"
    assert as_json([final[r["id"]] for r in plain]) == as_json(plain) == as_json(by_json)
    # MySQL's latin1 is Windows-1252 with its five unassigned bytes as the C1 controls they number
    high = plain[0]["l1"]
    assert (len(high), high[0], [high[b - 0x80] for b in (0x81, 0x8D, 0x8F, 0x90, 0x9D)]) == (
        128,
        "€",
        ["\x81", "\x8d", "\x8f", "\x90", "\x9d"],
    )
    assert [plain[0][k] for k in ("u16", "uc2", "cy", "e1", "s1", "ec", "e8")] == [
        "😀 ok",
        "ü ok",
        "привет",
        "café",
        "é,x",
        "ж",
        "😀",
    ]
    assert (plain[1]["l1"], plain[1]["u32"]) == ("Ã\x81Ã\x9d", "x😀y")


async def test_a_date_no_calendar_has_is_null_both_ways_and_never_stops_the_stream(mariadb: MariaDB) -> None:
    """A session with ``sql_mode=ALLOW_INVALID_DATES`` may store ``2024-02-30``. The library (and
    deltaforge's compiled reader after it) raised ``ValueError`` building the date: the stream
    stopped at that row for good. Now such a date is null, as a zero date is, and as a snapshot
    reads it; through the compiled reader (full row images) and the library's (a partial one)."""
    db = prepare(mariadb, "CREATE TABLE t (id INT PRIMARY KEY, d DATE, dt DATETIME(3), n INT)", [])
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    bad = ["2024-02-30", "2023-02-29", "2024-04-31", "0001-01-01", "2024-02-29"]
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
        cur.executemany(
            "INSERT INTO t VALUES (%s, %s, %s, 0)", [(i, d, f"{d} 01:02:03.5") for i, d in enumerate(bad)]
        )
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute("UPDATE t SET d = '2025-06-31', dt = '2025-06-31 00:00:00', n = 1 WHERE id = 4")
    events = await read_n(src, len(bad) + 1)
    await src.close()
    by_json, plain = await snapshot_both_ways(mariadb, db)
    final = {e.after["id"]: e.after for e in events if e.after is not None}
    assert as_json([{k: final[r["id"]][k] for k in r} for r in plain]) == as_json(plain) == as_json(by_json)
    assert [(r["d"], r["dt"]) for r in plain] == [
        (None, None),
        (None, None),
        (None, None),
        (date(1, 1, 1), datetime(1, 1, 1, 1, 2, 3, 500_000)),
        (None, None),
    ]
