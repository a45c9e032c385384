"""Table maps parsed once per distinct body (``deltaforge/sources/mysql/tablemaps.py``): rows
decode exactly as with the library's own table maps, through ALTERs, renames and re-creations."""

from __future__ import annotations

from typing import Any

import pytest
from pymysqlreplication.constants.BINLOG import TABLE_MAP_EVENT
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from deltaforge.sources.mysql import tablemaps
from tests.mysql_kit import binlog_reader, fresh_db
from tests.servers.mariadb import MariaDB

ROWS_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)


def decoded(server: MariaDB, start: tuple[str, int], end: int, table_map: type) -> list[tuple[Any, ...]]:
    """Every rows event from ``start`` up to the binlog offset ``end`` (same file): its table, its
    columns as the table map described them, and its rows."""
    stream = binlog_reader(server, *start, [*ROWS_EVENTS, table_map], server_id=4343)
    out: list[tuple[Any, ...]] = []
    maps = 0
    try:
        for ev in stream:
            if ev.packet.log_pos > end:
                break
            if isinstance(ev, TableMapEvent):
                assert type(ev) is table_map
                maps += 1
                continue
            columns = [(c.name, c.type, getattr(c, "unsigned", False), getattr(c, "is_primary", False))
                       for c in ev.columns]  # fmt: skip
            out.append((type(ev).__name__, ev.schema, ev.table, columns, ev.rows))
    finally:
        stream.close()
    out.append(("table maps", maps))
    return out


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's own table maps again after the test (``install`` is for a process's life),
    and an empty cache meanwhile."""
    events = BinLogPacketWrapper._BinLogPacketWrapper__event_map
    monkeypatch.setitem(events, TABLE_MAP_EVENT, events[TABLE_MAP_EVENT])
    monkeypatch.setattr(tablemaps.KnownTableMap, "parsed", {})


def test_rows_decode_as_with_the_librarys_own_table_maps_through_schema_changes(
    mariadb: MariaDB, restored: None
) -> None:
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n INT UNSIGNED)")
        cur.execute("CREATE TABLE b (k VARCHAR(10) PRIMARY KEY, e ENUM('x','y'), t DATETIME(3))")
        cur.execute("SHOW MASTER STATUS")
        start = cur.fetchone()[:2]

        def some(round_: int) -> None:
            for i in range(5):  # one transaction each: a table map each
                cur.execute(
                    "INSERT INTO a (id, v, n) VALUES (%s, %s, %s)", (round_ * 100 + i, f"v{i}", 4_000_000_000)
                )
                cur.execute(
                    "INSERT INTO b (k, e, t) VALUES (%s, 'y', '2024-01-02 03:04:05.678')", (f"{round_}-{i}",)
                )
            cur.execute("UPDATE a SET v = CONCAT(v, '!') WHERE MOD(id, 2) = 0")
            cur.execute("DELETE FROM b WHERE k LIKE %s", (f"{round_}-1",))

        some(0)
        cur.execute("ALTER TABLE a ADD COLUMN extra BIGINT DEFAULT 7")  # the same name, other columns
        some(1)
        cur.execute("ALTER TABLE a MODIFY v VARCHAR(200)")  # the same columns, another type
        some(2)
        cur.execute("RENAME TABLE b TO b_old")
        cur.execute("CREATE TABLE b (k VARCHAR(10) PRIMARY KEY, gone INT, e ENUM('x','y'), t DATETIME(3))")
        some(3)
        cur.execute("FLUSH TABLES")  # the same tables under new table ids: bodies that differ only there
        some(4)
        cur.execute("SHOW MASTER STATUS")
        file, end = cur.fetchone()[:2]
    assert file == start[0]

    plain = decoded(mariadb, start, end, TableMapEvent)
    cached = decoded(mariadb, start, end, tablemaps.install())
    assert cached == plain
    # the rows of each round went through new table maps (the ALTERs and the new table show)
    assert {tuple(col[0] for col in ev[3]) for ev in plain[:-1] if ev[2] == "a"} == {
        ("id", "v", "n"), ("id", "v", "n", "extra")
    }  # fmt: skip
    # ... and through table maps parsed before: one parse per distinct body, not per transaction
    maps = plain[-1][1]
    distinct = len(tablemaps.KnownTableMap.parsed)
    assert 0 < distinct < maps / 4, (distinct, maps)


def test_a_damaged_table_map_whose_body_was_seen_before_still_fails_its_checksum(restored: None) -> None:
    """The checksum covers the header too: a table map whose header is damaged on disk, its body
    the one before it, still reads as damaged (the verdict is each event's own, never the cached
    parse's), so the decoder halts at it."""
    with MariaDB(server_id=13) as server:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE z")
            cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY)")
            cur.execute("SHOW MASTER STATUS")
            start = cur.fetchone()[:2]
            cur.execute("INSERT INTO z.t VALUES (1)")
            cur.execute("INSERT INTO z.t VALUES (2)")
            cur.execute("SHOW MASTER STATUS")
            end = cur.fetchone()[1]
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", start)
            maps = [int(r[1]) for r in cur.fetchall() if r[2] == "Table_map"]
            cur.execute("FLUSH BINARY LOGS")  # closed: nothing writes the file again
        assert len(maps) == 2
        binlog = server.data / start[0]
        raw = bytearray(binlog.read_bytes())
        raw[maps[1]] ^= 0xFF  # the second table map's timestamp: its body stays as it was
        binlog.write_bytes(bytes(raw))

        verdicts: list[bool | None] = []
        stream = binlog_reader(server, *start, [WriteRowsEvent, tablemaps.install()], server_id=4344)
        try:
            for ev in stream:
                if ev.packet.log_pos > end:
                    break
                if isinstance(ev, TableMapEvent):
                    verdicts.append(ev._is_event_valid)
        finally:
            stream.close()
    assert len(tablemaps.KnownTableMap.parsed) == 1  # the second one's body was known
    assert verdicts == [True, False]
