"""Rows events decoded by readers compiled for their table (``deltaforge/sources/mysql/rowimages.py``):
every value equal to python-mysql-replication's own decoding of the same binlog, for every
column type that is compiled, and the library's decoding kept for what is not."""

from __future__ import annotations

import random
from typing import Any

from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from deltaforge.sources.mysql.rowimages import RowImages
from tests.mysql_kit import binlog_reader, fresh_db
from tests.servers.mariadb import MariaDB

ROWS_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)

COMPILED = """
    id INT PRIMARY KEY,
    t1 TINYINT, t2 TINYINT UNSIGNED, s1 SMALLINT, s2 SMALLINT UNSIGNED,
    m1 MEDIUMINT, m2 MEDIUMINT UNSIGNED, i2 INT UNSIGNED, b1 BIGINT, b2 BIGINT UNSIGNED,
    f FLOAT, d DOUBLE,
    n1 DECIMAL(10,0), n2 DECIMAL(20,6), n3 DECIMAL(65,30), n4 DECIMAL(5,5), n5 DECIMAL(12,2),
    v1 VARCHAR(20), v2 VARCHAR(300), c1 CHAR(3), c2 CHAR(200),
    l1 VARCHAR(30) CHARACTER SET latin1, bin1 BINARY(4), bin2 VARBINARY(300),
    tx TEXT, mtx MEDIUMTEXT, bl BLOB, lbl LONGBLOB, tb TINYBLOB,
    e1 ENUM('x','y','z'), e2 ENUM({many}),
    dt DATE, dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6), dt1 DATETIME(1),
    ts0 TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, ts5 TIMESTAMP(5) NULL, ts6 TIMESTAMP(6) NULL,
    y YEAR
""".format(many=",".join(f"'e{i}'" for i in range(300)))  # 300 values: stored in two bytes


def decoded(server: MariaDB, start: tuple[str, int], end: int, images: RowImages | None) -> list[Any]:
    """Every rows event's rows from ``start`` up to the binlog offset ``end``, decoded by the
    library (``images`` None) or by ``images``."""
    stream = binlog_reader(server, *start, [*ROWS_EVENTS, TableMapEvent], server_id=4444)
    out: list[Any] = []
    try:
        for ev in stream:
            if ev.packet.log_pos > end:
                break
            if isinstance(ev, TableMapEvent):
                continue
            if images is not None:
                rows = images.rows_of(ev, 2 if isinstance(ev, UpdateRowsEvent) else 1)
                assert ev.rows is rows  # what the decoder reads later (a partial image's marks) sees them too
            # the library's reasons for its Nones: deltaforge does not read them
            rows = [{k: v for k, v in row.items() if not k.endswith("none_sources")} for row in ev.rows]
            out.append((type(ev).__name__, ev.table, rows))
    finally:
        stream.close()
    return out


def a_value(rng: random.Random, column: str, i: int) -> Any:
    """A random value for ``column`` of row ``i``: extremes, zero dates, multibyte text, NULL."""
    if rng.random() < 0.15 and column != "id":
        return None
    ints = {"t1": (-128, 127), "t2": (0, 255), "s1": (-32768, 32767), "s2": (0, 65535),
            "m1": (-8388608, 8388607), "m2": (0, 16777215), "i2": (0, 4294967295),
            "b1": (-(2**63), 2**63 - 1), "b2": (0, 2**64 - 1)}  # fmt: skip
    if column in ints:
        low, high = ints[column]
        return rng.choice([low, high, 0, -1 if low else 1, rng.randint(low, high)])
    text = "aé€😀z"
    match column:
        case "f" | "d":
            return rng.choice([0.0, -1.5, 3.4e38 if column == "f" else 1.7e308, rng.uniform(-1e6, 1e6)])
        case "n1" | "n2" | "n3" | "n4" | "n5":
            digits = {"n1": (10, 0), "n2": (14, 6), "n3": (35, 30), "n4": (0, 5), "n5": (10, 2)}[column]
            whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, digits[0]))) or "0"
            frac = "".join(rng.choice("0123456789") for _ in range(digits[1]))
            return f"{rng.choice(['', '-'])}{whole}{'.' + frac if frac else ''}"
        case "v1" | "c1" | "l1":
            size = {"v1": 20, "c1": 3, "l1": 30}[column]
            alphabet = "aé¿ß" if column == "l1" else text
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, size)))
        case "v2" | "c2" | "tx" | "mtx":
            size = {"v2": 300, "c2": 200, "tx": 2000, "mtx": 70_000}[column]
            return "".join(
                rng.choice(text) for _ in range(rng.choice([0, 1, 255, 256, rng.randint(0, size)]))
            )
        case "bin1" | "bin2" | "bl" | "lbl" | "tb":
            size = {"bin1": 4, "bin2": 300, "bl": 3000, "lbl": 70_000, "tb": 255}[column]
            return rng.randbytes(rng.choice([0, 1, size, rng.randint(0, size)]) if column != "bin1" else 4)
        case "e1":
            return rng.choice(["x", "y", "z"])
        case "e2":
            return f"e{rng.randint(0, 299)}"
        case "dt":
            return rng.choice(
                ["0000-00-00", "1000-01-01", "9999-12-31", "2024-02-29", f"20{i % 100:02d}-06-15"]
            )
        case "dt0" | "dt3" | "dt6" | "dt1":
            return rng.choice(["0000-00-00 00:00:00", "1000-01-01 00:00:00", "9999-12-31 23:59:59.999999",
                               f"2024-01-02 03:04:{i % 60:02d}.{rng.randint(0, 999999):06d}"])  # fmt: skip
        case "ts0" | "ts2" | "ts5" | "ts6":
            return rng.choice(["1970-01-01 00:00:01", "2038-01-19 03:14:07.999999",
                               f"2001-09-09 01:46:{i % 60:02d}.{rng.randint(0, 999999):06d}"])  # fmt: skip
        case "y":
            return rng.choice([1901, 2155, 2024])
    raise AssertionError(column)


def test_every_compiled_type_decodes_as_the_library_decodes_it(mariadb: MariaDB) -> None:
    rng = random.Random(20261202)
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates allowed
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute(f"CREATE TABLE t ({COMPILED})")
        columns = [line.split()[0] for line in COMPILED.replace("\n", " ").split(", ") if line.strip()]
        cur.execute("SHOW MASTER STATUS")
        start = cur.fetchone()[:2]
        marks = ", ".join(["%s"] * len(columns))
        for i in range(1, 121):
            cur.execute(f"INSERT INTO t VALUES ({marks})", [i] + [a_value(rng, c, i) for c in columns[1:]])
        cur.executemany(  # many rows per event
            f"INSERT INTO t VALUES ({marks})",
            [[i] + [a_value(rng, c, i) for c in columns[1:]] for i in range(121, 241)],
        )
        for i in range(1, 241, 7):
            sets = ", ".join(f"{c} = %s" for c in columns[1:])
            cur.execute(f"UPDATE t SET {sets} WHERE id = %s", [a_value(rng, c, i) for c in columns[1:]] + [i])
        cur.execute("UPDATE t SET id = id + 1000 WHERE id % 5 = 0")  # a key moved: both images
        cur.execute("DELETE FROM t WHERE id % 3 = 0")
        cur.execute("SHOW MASTER STATUS")
        end = cur.fetchone()[1]

    images = RowImages()
    mine, theirs = decoded(mariadb, start, end, images), decoded(mariadb, start, end, None)
    assert sum(len(rows) for *_, rows in theirs) > 400
    assert {name for name, *_ in theirs} == {"WriteRowsEvent", "UpdateRowsEvent", "DeleteRowsEvent"}
    assert mine == theirs
    assert (images.compiled_events, images.library_events) == (len(mine), 0)


def test_what_is_not_compiled_is_decoded_by_the_library(mariadb: MariaDB) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE odd (id INT PRIMARY KEY, j JSON, b BIT(10), s SET('a','b'), tm TIME(3))")
        cur.execute("CREATE TABLE plain (id INT PRIMARY KEY, a INT, v VARCHAR(10))")
        cur.execute("SHOW MASTER STATUS")
        start = cur.fetchone()[:2]
        cur.execute("""INSERT INTO odd VALUES (1, '{"k": [1, 2]}', b'1010101010', 'a,b', '-12:34:56.789'),
                       (2, NULL, NULL, '', '838:59:59')""")
        cur.execute("UPDATE odd SET tm = '00:00:01' WHERE id = 1")
        cur.execute("INSERT INTO plain VALUES (1, 10, 'x'), (2, 20, 'y')")
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")  # images without every column
        cur.execute("UPDATE plain SET a = 11 WHERE id = 1")
        cur.execute("DELETE FROM plain WHERE id = 2")
        cur.execute("SET SESSION binlog_row_image = 'FULL'")
        cur.execute("UPDATE plain SET a = 12 WHERE id = 1")
        cur.execute("SHOW MASTER STATUS")
        end = cur.fetchone()[1]

    images = RowImages()
    mine, theirs = decoded(mariadb, start, end, images), decoded(mariadb, start, end, None)
    assert mine == theirs
    # odd's rows (JSON, BIT, SET, TIME) and plain's minimal images by the library; plain's
    # full images by its compiled readers
    assert [name for name, *_ in mine] == ["WriteRowsEvent", "UpdateRowsEvent", "WriteRowsEvent",
                                           "UpdateRowsEvent", "DeleteRowsEvent", "UpdateRowsEvent"]  # fmt: skip
    assert (images.compiled_events, images.library_events) == (2, 4)
    assert mine[3][2] == [{"before_values": {"id": 1, "a": None, "v": None},
                           "after_values": {"id": None, "a": 11, "v": None}}]  # fmt: skip
