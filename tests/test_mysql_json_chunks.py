"""MariaDB snapshot chunks read as one JSON document give the rows the plain read gives, value
for value and type for type; a table or a chunk that cannot make the trip is read plainly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltaforge.events import Row
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.mysql.json_chunks import JsonChunks
from deltaforge.sources.mysql.snapshot import MySQLChunks
from tests.mysql_kit import fresh_db, read_n, source
from tests.servers.mariadb import CDC_USER, MariaDB

EVERY_TYPE = """CREATE TABLE t (
    id BIGINT PRIMARY KEY, ti TINYINT, flag TINYINT(1), si SMALLINT UNSIGNED, mi MEDIUMINT, i INT,
    bu BIGINT UNSIGNED, z INT(5) ZEROFILL, dc DECIMAL(20,6), d DATE, tm TIME(3), dtm DATETIME(6),
    ts TIMESTAMP(3) NULL, y YEAR, c CHAR(5), vc VARCHAR(100), l VARCHAR(50) CHARACTER SET latin1,
    tx TEXT, fl FLOAT, db DOUBLE, j JSON, e ENUM('a','b c'), s SET('x','y'), bn BINARY(4), vb VARBINARY(20), bl BLOB
) CHARACTER SET utf8mb4"""

ROWS = [
    "(1, -128, 1, 65535, -8388608, -2147483648, 18446744073709551615, 42, -12345678901234.123456, "
    "'2024-02-29', '-838:59:59.000', '2024-01-02 03:04:05.123456', '2024-05-06 07:08:09.500', 1901, "
    "'ab', 'héllo \"q\" \\\\ \\n\\t ✓ 😀', 'café', REPEAT('t', 3000), 1.1, -1039514241563211.8, '{\"k\": [1, \"two\"], \"n\": null}', "
    "'b c', 'x,y', x'00ff1027', x'', x'000102fffe')",
    "(2, 127, 0, 0, 8388607, 2147483647, 0, 0, 0.000001, '1000-01-01', '00:00:00.001', "
    "'9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999', 2155, '', '', '', '', -38227300, 5e-324, '[]', 'a', '', "
    "x'00000000', x'00', x'')",
    "(3" + ", NULL" * 25 + ")",
    "(4"
    + ", NULL" * 8
    + ", '0000-00-00', NULL, '0000-00-00 00:00:00', '0000-00-00 00:00:00'"
    + ", NULL" * 13
    + ")",
]


def prepare(server: MariaDB, ddl: str, rows: list[str]) -> str:
    db = fresh_db(server)
    with server.root(db) as c, c.cursor() as cur:
        cur.execute(f"GRANT CREATE, INSERT, UPDATE ON {db}.* TO '{CDC_USER}'@'%'")
        cur.execute(ddl)
        for r in rows:
            cur.execute(f"INSERT INTO t VALUES {r}")
    return db


async def read_all(reader: MySQLChunks, ref: TableRef, chunk: int) -> list[Row]:
    rows: list[Row] = []
    after: list[Any] | None = None
    more = True
    while more:
        got, after, more = await reader.chunk(ref, after, chunk)
        rows += got
    return rows


async def both_ways(server: MariaDB, db: str, chunk: int = 2) -> tuple[list[Row], list[Row], MySQLChunks]:
    """The table read through the JSON form, then plainly; and the reader (its JSON form, if
    still there, was used for every chunk)."""
    src = source(server, [f"{db}.t"])
    reader = MySQLChunks(src, f"{db}.signal")
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"{db}.t"])
        by_json = await read_all(reader, ref, chunk)
        json_form = reader.known[ref.name].json
        reader.known[ref.name].json = None
        plain = await read_all(reader, ref, chunk)
        reader.known[ref.name].json = json_form
    finally:
        await reader.close()
    return by_json, plain, reader


def exact(rows: list[Row]) -> list[list[tuple[str, str]]]:
    """Each value's repr, in column order: ``Decimal('1.50')`` is not ``Decimal('1.5')``, nor
    ``1`` ``True``, nor ``'1'`` ``b'1'``."""
    return [[(k, repr(v)) for k, v in r.items()] for r in rows]


async def test_every_column_type_comes_back_as_the_plain_read_gives_it(mariadb: MariaDB) -> None:
    db = prepare(mariadb, EVERY_TYPE, ROWS)
    by_json, plain, reader = await both_ways(mariadb, db)
    assert reader.known[f"{db}.t"].json is not None, "the table was not read as JSON"
    assert len(plain) == 4
    assert exact(by_json) == exact(plain)
    assert by_json[0]["bu"] == 18446744073709551615 and by_json[0]["z"] == 42
    assert by_json[0]["bl"] == b"\x00\x01\x02\xff\xfe" and by_json[0]["j"].startswith('{"k"')


DOUBLES = st.floats(allow_nan=False, allow_infinity=False)
FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), DOUBLES, FLOATS),
                     min_size=1, max_size=8))  # fmt: skip
def test_any_text_and_float_comes_back_as_the_plain_read_gives_it(
    mariadb: MariaDB, rows: list[tuple[str, float, float]]
) -> None:
    values = [f"({i}, {mariadb_literal(t)}, {d!r}, {f!r})" for i, (t, d, f) in enumerate(rows)]
    db = prepare(mariadb, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT, d DOUBLE, f FLOAT) CHARACTER SET utf8mb4",
                 values)  # fmt: skip
    by_json, plain, reader = asyncio.run(both_ways(mariadb, db, chunk=3))
    assert reader.known[f"{db}.t"].json is not None
    assert exact(by_json) == exact(plain)
    assert [r["v"] for r in by_json] == [t for t, _, _ in rows]


def mariadb_literal(text: str) -> str:
    return "_utf8mb4 x'" + text.encode().hex() + "'" if text else "''"


async def test_odd_column_names_come_back_as_the_plain_read_gives_them(mariadb: MariaDB) -> None:
    """Under ``NO_BACKSLASH_ESCAPES`` too: a backslash in a quoted literal would then be two."""
    ddl = "CREATE TABLE t (`it's` INT PRIMARY KEY, `back\\slash` TEXT, `ключ` INT, `tick``s` TEXT) CHARACTER SET utf8mb4"
    db = prepare(mariadb, ddl, ["(1, 'a', 2, 'b')", "(3, NULL, NULL, 'c')"])
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.sql_mode")
        ((was,),) = cur.fetchall()
        cur.execute("SET GLOBAL sql_mode = CONCAT(@@GLOBAL.sql_mode, ',NO_BACKSLASH_ESCAPES')")
    try:
        by_json, plain, reader = await both_ways(mariadb, db)
    finally:
        with mariadb.root() as c, c.cursor() as cur:
            cur.execute("SET GLOBAL sql_mode = %s", (was,))
    assert reader.known[f"{db}.t"].json is not None
    assert exact(by_json) == exact(plain)
    assert list(by_json[0]) == ["it's", "back\\slash", "ключ", "tick`s"]


async def test_a_table_with_a_bit_column_is_read_plainly(mariadb: MariaDB) -> None:
    db = prepare(
        mariadb, "CREATE TABLE t (id INT PRIMARY KEY, bt BIT(5))", ["(1, b'10101')", "(2, b'0')", "(3, NULL)"]
    )
    by_json, plain, reader = await both_ways(mariadb, db)
    assert reader.known[f"{db}.t"].json is None
    assert exact(by_json) == exact(plain)
    assert [r["bt"] for r in by_json] == [b"\x15", b"\x00", None]


async def test_a_chunk_too_big_for_one_value_is_read_plainly_and_whole(mariadb: MariaDB) -> None:
    """The server cuts a JSON document short at ``max_allowed_packet`` (with a warning): the
    chunk's rows come from the plain read, and none is missing."""
    rows = [f"({i}, REPEAT('{i % 10}', 4000))" for i in range(1, 41)]
    db = prepare(mariadb, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)", rows)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.max_allowed_packet")
        ((was,),) = cur.fetchall()
        cur.execute("SET GLOBAL max_allowed_packet = 65536")  # read by the reader's new sessions
    try:
        by_json, plain, reader = await both_ways(mariadb, db, chunk=25)
    finally:
        with mariadb.root() as c, c.cursor() as cur:
            cur.execute(f"SET GLOBAL max_allowed_packet = {int(was)}")
    assert reader.known[f"{db}.t"].json is None, "the chunk was not too big: nothing was proven"
    assert [r["id"] for r in by_json] == list(range(1, 41))
    assert exact(by_json) == exact(plain)


async def test_a_json_read_the_server_refuses_falls_back_to_the_plain_read(mariadb: MariaDB) -> None:
    """MySQL 8's JSON_ARRAYAGG takes no ORDER BY: a server that refuses the JSON query (here,
    one naming a table that is not there) gets the plain read, with every row."""
    db = prepare(
        mariadb, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)", [f"({i}, 'r{i}')" for i in range(1, 8)]
    )
    src = source(mariadb, [f"{db}.t"])
    reader = MySQLChunks(src, f"{db}.signal")
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"{db}.t"])
        table = reader.known[ref.name]
        table.json_first = table.json_after = "SELECT COUNT(*) AS n, NULL AS doc FROM no_such_table LIMIT %s"
        rows = await read_all(reader, ref, 3)
    finally:
        await reader.close()
    assert table.json is None
    assert [(r["id"], r["v"]) for r in rows] == [(i, f"r{i}") for i in range(1, 8)]


def test_a_column_type_outside_the_known_ones_keeps_the_table_plain() -> None:
    def col(name: str, typ: str, charset: str | None = None, full: str = "") -> dict[str, Any]:
        return {
            "COLUMN_NAME": name,
            "DATA_TYPE": typ,
            "COLUMN_TYPE": full or typ,
            "CHARACTER_SET_NAME": charset,
        }

    assert JsonChunks.of([col("id", "int"), col("g", "point")]) is None
    assert JsonChunks.of([col("id", "int"), col("b", "bit", full="bit(3)")]) is None
    form = JsonChunks.of(
        [col("id", "int"), col("z", "int", full="int(5) unsigned zerofill"), col("v", "varchar", "utf8mb4")]
    )
    assert form is not None
    assert (
        form.pairs
        == "_utf8mb4 X'6964', `id`, _utf8mb4 X'7a', CAST(`z` AS CHAR), _utf8mb4 X'76', CAST(`v` AS CHAR)"
    )


async def test_invisible_columns_are_read_as_the_binlog_carries_them(mariadb: MariaDB) -> None:
    """``SELECT *`` leaves out MariaDB's INVISIBLE columns; the binlog's row images have them. A
    snapshot row must have the columns a change of the same row has, or a sink's replay keeps
    the row without them."""
    db = prepare(
        mariadb,
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), secret INT INVISIBLE)",
        [],
    )
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t (id, v, secret) VALUES (1, 'a', 11), (2, 'b', 22), (3, 'c', 33)")
    by_json, plain, reader = await both_ways(mariadb, db)
    assert reader.known[f"{db}.t"].json is not None, "the table was not read as JSON"
    expected = [{"id": i, "v": v, "secret": s} for i, v, s in ((1, "a", 11), (2, "b", 22), (3, "c", 33))]
    assert by_json == expected
    assert plain == expected

    src = source(mariadb, [f"{db}.t"])
    await src.open(None)  # no checkpoint, no snapshot: the binlog from its start
    try:
        changes = await read_n(src, 3)
    finally:
        await src.close()
    assert [list(e.after or {}) for e in changes] == [list(r) for r in expected]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "plain"])
async def test_a_column_added_or_dropped_between_chunks_is_in_the_next_chunk_as_it_is_now(
    mariadb: MariaDB, as_json: bool
) -> None:
    """The chunk queries name the table's columns; after an ALTER TABLE the next chunk is read
    with the columns the table has then, not those it had when the snapshot began."""
    db = prepare(
        mariadb, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", ["(1, 'a')", "(2, 'b')", "(3, 'c')"]
    )
    src = source(mariadb, [f"{db}.t"])
    reader = MySQLChunks(src, f"{db}.signal")
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"{db}.t"])
        if not as_json:
            reader.known[ref.name].json = None
        first, after, _ = await reader.chunk(ref, None, 1)
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("ALTER TABLE t ADD COLUMN extra INT NOT NULL DEFAULT 7")
        second, after, _ = await reader.chunk(ref, after, 1)
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("ALTER TABLE t DROP COLUMN v")
        third, _, more = await reader.chunk(ref, after, 1)
        read_as_json = reader.known[ref.name].json is not None
    finally:
        await reader.close()
    assert first == [{"id": 1, "v": "a"}]
    assert second == [{"id": 2, "v": "b", "extra": 7}]
    assert third == [{"id": 3, "extra": 7}] and not more
    assert read_as_json == as_json


async def test_a_renamed_key_column_fails_the_chunk_instead_of_rebuilding_forever(mariadb: MariaDB) -> None:
    """The keyset pagination names the key column; once it is renamed, rebuilding the queries
    from the new columns cannot help, so the chunk's error is raised, not retried without end."""
    import pymysql

    db = prepare(mariadb, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", ["(1, 'a')", "(2, 'b')"])
    reader = MySQLChunks(source(mariadb, [f"{db}.t"]), f"{db}.signal")
    await reader.open(1)
    try:
        (ref,) = await reader.tables([f"{db}.t"])
        _, after, _ = await reader.chunk(ref, None, 1)
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("ALTER TABLE t RENAME COLUMN id TO ident")
        with pytest.raises(pymysql.err.MySQLError) as raised:
            await asyncio.wait_for(reader.chunk(ref, after, 1), 30)
    finally:
        await reader.close()
    assert raised.value.args[0] == 1054
