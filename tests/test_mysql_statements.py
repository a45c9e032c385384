"""Statements in the binlog that change rows without row events: TRUNCATE is delivered as
``op: t``; an INSERT/UPDATE/DELETE logged as a statement (a session on binlog_format STATEMENT)
halts the reader with its coordinates instead of being skipped."""

from __future__ import annotations

import re

import pytest

from deltaforge.sources.base import SourceMisconfigured
from deltaforge.sources.mysql.source import MySQLSource
from tests.mysql_kit import opened_on, read_n, source
from tests.servers.mariadb import MariaDB


async def _capturing_t_beside(mariadb: MariaDB, other: str) -> tuple[str, MySQLSource]:
    """A fresh database with tables ``t`` and ``other``, and a source capturing ``t`` only, open."""
    db, src = await opened_on(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {other} (id INT PRIMARY KEY)")
    return db, src


async def test_a_truncate_of_a_captured_table_is_delivered_as_op_t_in_commit_order(mariadb: MariaDB) -> None:
    """However the statement names the table (alone in the session's database, qualified from
    another, backquoted after a comment), a TRUNCATE of a captured table is an ``op: t`` event in
    its place in the stream; one of an uncaptured table is nothing. Before, every one was
    skipped: a truncated table's rows stayed in every sink."""
    db, src = await _capturing_t_beside(mariadb, "other")
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1)")
        cur.execute("INSERT INTO other VALUES (1)")
        cur.execute("TRUNCATE other")
        cur.execute("INSERT INTO t VALUES (2)")
        cur.execute("TRUNCATE TABLE t")
        cur.execute("INSERT INTO t VALUES (3)")
    with mariadb.root() as c, c.cursor() as cur:  # no session database
        cur.execute(f"TRUNCATE {db}.t")
        cur.execute(f"/* app: nightly */ TRUNCATE TABLE `{db}`.`t`")
        cur.execute(f"INSERT INTO {db}.t VALUES (4)")
    events = await read_n(src, 7)
    await src.close()
    assert [(e.op, e.table) for e in events] == [
        ("c", "t"), ("c", "t"), ("t", "t"), ("c", "t"), ("t", "t"), ("t", "t"), ("c", "t"),
    ]  # fmt: skip
    truncates = [e for e in events if e.op == "t"]
    assert all(e.source.db == db and e.before is None and e.after is None and e.tx_end for e in truncates)
    assert [e.order for e in events] == sorted(e.order for e in events)
    assert len({e.event_id for e in events}) == 7
    # a restart from the checkpoint after the first TRUNCATE reads on from there, once
    again = source(mariadb, [f"{db}.t"])
    await again.open(events[2].checkpoint)
    rest = await read_n(again, 4)
    await again.close()
    assert [(e.op, e.event_id) for e in rest] == [(e.op, e.event_id) for e in events[3:]]


async def test_a_row_change_logged_as_a_statement_halts_the_reader_saying_where(mariadb: MariaDB) -> None:
    """A session that switched to binlog_format=STATEMENT writes its INSERT as a query event:
    its rows are not in the binlog. The reader stops with the statement's coordinates and what
    to set; the rows read before it are delivered first. A statement on a table it does not
    capture is not its business and does not stop it."""
    db, src = await _capturing_t_beside(mariadb, "audit_log")
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1)")
        cur.execute("SET SESSION binlog_format = 'STATEMENT'")
        cur.execute("INSERT INTO audit_log VALUES (1)")  # not captured: read past
        cur.execute("SET SESSION binlog_format = 'ROW'")
        cur.execute("INSERT INTO t VALUES (2)")
    try:
        first = await read_n(src, 2)
        assert [e.after for e in first] == [{"id": 1}, {"id": 2}]
        with mariadb.root(db) as c, c.cursor() as cur:
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute("UPDATE t SET id = 20 WHERE id = 2")
        with pytest.raises(SourceMisconfigured) as info:
            await read_n(src, 1)
    finally:
        await src.close()
    msg = str(info.value)
    assert re.search(r"UPDATE logged as a statement at mysql-bin\.\d+:\d+ ", msg), msg
    assert f"session database '{db}'" in msg
    assert "set binlog_format=ROW globally" in msg


def test_on_a_server_that_folds_names_a_truncate_in_any_case_is_delivered() -> None:
    """With lower_case_table_names=1 (Windows, macOS, some managed servers) names are stored,
    and row events carry them, in lower case, while a statement may spell them in any case: a
    ``TRUNCATE TABLE SHOP.ORDERS`` of the captured ``shop.orders`` was not recognised, and
    ``Shop.Orders`` listed in ``tables`` captured nothing at all. Both match in any case now."""
    import asyncio

    async def scenario(server: MariaDB) -> list[tuple[str, str, str]]:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE Shop")
            cur.execute("CREATE TABLE Shop.Orders (id INT PRIMARY KEY)")
        src = source(server, ["Shop.Orders"])
        await src.open(None)
        with server.root() as c, c.cursor() as cur:
            cur.execute("INSERT INTO Shop.Orders VALUES (1)")
            cur.execute("TRUNCATE TABLE SHOP.ORDERS")
            cur.execute("INSERT INTO shop.orders VALUES (2)")
        try:
            declared = [(t.db, t.table) for t in await src.describe_tables()]
            assert declared == [("shop", "orders")]  # the schema recorded at start, too
            return [(e.op, e.source.db, e.table) for e in await read_n(src, 3)]
        finally:
            await src.close()

    with MariaDB(extra_args=["--lower-case-table-names=1"], server_id=13) as server:
        events = asyncio.run(scenario(server))
    assert events == [("c", "shop", "orders"), ("t", "shop", "orders"), ("c", "shop", "orders")]


def test_an_unquoted_name_is_every_code_point_mysql_allows_and_no_other() -> None:
    """MySQL's unquoted identifiers are ``[0-9A-Za-z_$\\u0080-\\uffff]``. The decoder's patterns
    spell that class as its complement, which compiles in a fraction of the time (the range
    made the decoder's start 130 ms slower); checked for every code point, in any case."""
    from deltaforge.sources.mysql.statements import _IDENT, truncated

    allowed = re.compile(r"[0-9A-Za-z_$\u0080-\uffff]+")
    name = re.compile(_IDENT, re.I)  # as the patterns use it
    for point in range(0x110000):
        ch = chr(point)
        assert bool(name.fullmatch(ch)) == bool(allowed.fullmatch(ch)), hex(point)
    assert name.fullmatch("`a``b c`") and not name.fullmatch("a b")
    assert truncated("TRUNCATE café.`naï``ve`", "x") == ("café", "naï`ve")
