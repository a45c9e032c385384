"""MySQL/MariaDB transactions as the source sees them: XA, and checkpoints inside a transaction."""

from __future__ import annotations

from tests.helpers import one_transaction_in_pieces
from tests.mysql_kit import opened_on, read_n, source
from tests.servers.mariadb import MariaDB


def _xa_prepare(server: MariaDB, db: str, xid: str, ids: list[int]) -> None:
    """XA START ... XA PREPARE on a connection that then goes away (the transaction stays prepared)."""
    with server.root(db) as c, c.cursor() as cur:
        cur.execute(f"XA START '{xid}'")
        for i in ids:
            cur.execute(f"INSERT INTO {db}.t VALUES ({i})")
        cur.execute(f"XA END '{xid}'")
        cur.execute(f"XA PREPARE '{xid}'")


async def test_xa_transactions_are_delivered_at_commit_in_commit_order_and_rollbacks_never(
    mariadb: MariaDB,
) -> None:
    db, src = await opened_on(mariadb)
    _xa_prepare(mariadb, db, "x1", [1, 2])
    _xa_prepare(mariadb, db, "x2", [3])
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (10)")  # commits before x1 does
        cur.execute("XA ROLLBACK 'x2'")
        cur.execute("XA COMMIT 'x1'")
        cur.execute("XA START 'x3'")
        cur.execute(f"INSERT INTO {db}.t VALUES (20)")
        cur.execute("XA END 'x3'")
        cur.execute("XA COMMIT 'x3' ONE PHASE")
    events = await read_n(src, 4)
    await src.close()
    assert [e.after["id"] for e in events if e.after] == [10, 1, 2, 20]  # commit order; x2 never
    assert [e.tx_end for e in events] == [True, False, True, True]
    orders = [e.order for e in events]
    assert orders == sorted(orders)  # x1's rows sort after what committed before it


async def test_a_restart_while_an_xa_transaction_is_prepared_still_delivers_it(mariadb: MariaDB) -> None:
    db, src = await opened_on(mariadb)
    _xa_prepare(mariadb, db, "x9", [1])
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t VALUES (2)")
    [two] = await read_n(src, 1)
    await src.close()  # checkpointed while x9 is prepared, then a restart
    again = source(mariadb, [f"{db}.t"])
    await again.open(again.load_position(two.checkpoint.to_doc()))
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("XA COMMIT 'x9'")
    got = await read_n(again, 2)
    await again.close()
    done = two.order
    assert [e.after["id"] for e in got if e.after and e.order > done] == [1]  # x9's row, after the restart


async def test_a_checkpoint_inside_a_transaction_resumes_with_the_rest_of_it(mariadb: MariaDB) -> None:
    """respect_source_tx: false may checkpoint inside a transaction (even inside one rows event):
    resuming there must bring rows k+1..n again. MariaDB resumes by the last committed GTID, so
    the whole transaction is read again and sinks skip what they hold by order."""
    db, src = await opened_on(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(
            f"INSERT INTO {db}.t VALUES " + ", ".join(f"({i})" for i in range(1, 11))
        )  # one rows event
    first = await read_n(src, 10)
    await src.close()
    cut = first[3]
    assert not cut.tx_end
    again = source(mariadb, [f"{db}.t"])
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = await read_n(again, 10)
    await again.close()
    assert [e.after["id"] for e in rest if e.after and e.order > cut.order] == [5, 6, 7, 8, 9, 10]


async def test_a_checkpoint_inside_a_transaction_resumes_with_the_rest_of_it_by_file_position(
    mariadb: MariaDB,
) -> None:
    """The same by binlog file and position (MySQL's way, here on MariaDB with resume_by: file):
    the resume starts where the transaction began, not after the rows event the checkpoint is in,
    so rows k+1..n of that event and the transaction's later events come again."""
    db, src = await opened_on(mariadb, resume_by="file")
    with mariadb.root(db) as c, c.cursor() as cur:
        c.begin()
        cur.execute(
            f"INSERT INTO {db}.t VALUES " + ", ".join(f"({i})" for i in range(1, 11))
        )  # one rows event
        cur.execute(f"INSERT INTO {db}.t VALUES (11), (12)")  # and another
        c.commit()
        cur.execute(f"INSERT INTO {db}.t VALUES (13)")  # the next transaction
    first = await read_n(src, 13)
    await src.close()
    cut = first[3]
    assert not cut.tx_end and cut.checkpoint.to_doc()["tx_start"]
    again = source(mariadb, [f"{db}.t"], resume_by="file")
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = await read_n(again, 13)
    await again.close()
    assert [e.after["id"] for e in rest if e.after and e.order > cut.order] == list(range(5, 14))


async def test_a_large_transaction_is_handed_over_in_pieces_as_it_is_read(mariadb: MariaDB) -> None:
    """A transaction larger than a read is handed over in pieces as it is decoded, not held until
    its XID: a 300k-row one took 700 MB held whole. The pieces make one transaction (one id,
    positions in order, one end). An XA transaction is still held until XA COMMIT: what XA
    PREPARE logs may yet be rolled back."""
    db, src = await opened_on(mariadb, read_chunk=500)
    _xa_prepare(mariadb, db, "big-xa", list(range(100_001, 102_001)))
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"INSERT INTO {db}.t SELECT seq FROM seq_1_to_20000")
        c.commit()
        cur.execute(f"INSERT INTO {db}.t VALUES (0)")
        c.commit()
    events = await one_transaction_in_pieces(src, 20_000, 1)
    assert [e.after["id"] for e in events[:20_000] if e.after] == list(range(1, 20_001))
    assert events[-1].after == {"id": 0} and events[-1].tx_end
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("XA COMMIT 'big-xa'")
    xa = await read_n(src, 2000)
    await src.close()
    assert [e.after["id"] for e in xa if e.after] == list(range(100_001, 102_001))
    assert [e.tx_end for e in xa].count(True) == 1 and xa[-1].tx_end
    cut = events[9_999]  # a checkpoint inside it, in a piece handed over before its XID was read
    again = source(mariadb, [f"{db}.t"], read_chunk=500)
    await again.open(again.load_position(cut.checkpoint.to_doc()))
    rest = [e.after["id"] for e in await read_n(again, 22_001) if e.after and e.order > cut.order]
    await again.close()
    assert rest == [*range(10_001, 20_001), 0, *range(100_001, 102_001)]
