"""The binlog look (``sources/mysql/retention.py``) against a real MariaDB: it runs in a worker
thread beside the reader, which goes on reading while the look's questions are answered."""

from __future__ import annotations

from typing import Any

from deltaforge.sources.mysql.position import BinlogPosition
from deltaforge.sources.mysql.retention import BinlogRetention
from tests.mysql_kit import fresh_db
from tests.servers.mariadb import MariaDB


class ReadOnMeanwhile:
    """A connection whose ``SHOW BINARY LOGS``, once answered, is followed by a row written and
    read by the reader before the look goes on: what a steady writer does between the look's
    question and its use of the answer."""

    def __init__(self, conn: Any, then: Any) -> None:
        self.conn, self.then = conn, then

    def cursor(self) -> Any:
        real, then = self.conn.cursor(), self.then

        class Cursor:
            def __enter__(self) -> Cursor:
                return self

            def __exit__(self, *exc: object) -> None:
                real.close()

            def execute(self, sql: str) -> None:
                real.execute(sql)
                if sql == "SHOW BINARY LOGS":
                    then()

            def fetchall(self) -> Any:
                return real.fetchall()

        return Cursor()


def test_a_row_read_while_the_binlog_is_looked_at_is_not_taken_for_a_reset(mariadb: MariaDB) -> None:
    """The look compared the sizes ``SHOW BINARY LOGS`` gave with what the reader had read by the
    time the answer was used: a row written and read in between put the reader past the size
    the server had given, and a healthy pipeline halted as position lost ("the binlog was
    reset"), seen once in CI under 1,000 writes a second. Only what was read before the
    question is compared."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as writer, writer.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
        retention = BinlogRetention("my", by_file=True)
        retention.opened(0)
        here = BinlogPosition(str(file), int(pos))
        retention.read(here, here)
        retention.confirmed(here)

        def written_and_read() -> None:
            cur.execute("INSERT INTO t VALUES (1)")
            cur.execute("SHOW MASTER STATUS")
            after = BinlogPosition(*[x for x in cur.fetchone()[:2]])
            assert after.file == here.file and after.pos > here.pos
            retention.read(after, after)

        with mariadb.root() as look:
            retention.check(ReadOnMeanwhile(look, written_and_read))
    assert retention.reset is None, retention.reset


def test_the_look_never_walks_what_the_reader_is_adding_to(mariadb: MariaDB) -> None:
    """The look (a worker thread) walked the reader's live record of the files it had read, per
    file, to find the oldest one a sink behind needs: a chunk read in a new file meanwhile (a
    rotation) cut into that walk, and the look failed with "dictionary changed size during
    iteration" (said as the check not having run, tried again 30 s later). Here the reader reads
    into a new file while the look compares the first file's position."""
    retention = BinlogRetention("my", by_file=False)
    retention.opened(0)
    held = BinlogPosition("mysql-bin.000001", 100, gtid="0-1-1")

    class ReadIntoANewFileMeanwhile(BinlogPosition):
        @property
        def order(self) -> tuple[int, ...]:
            nxt = BinlogPosition(f"mysql-bin.{len(retention._read_in) + 1:06d}", 4, gtid="0-1-9")
            retention.read(nxt, nxt)
            return super().order

    retention.read(held, ReadIntoANewFileMeanwhile("mysql-bin.000001", 500, gtid="0-1-2"))
    retention.confirmed(held)
    with mariadb.root() as look:
        retention.check(look)
    assert retention.looks == 1 and retention.retained is not None
    assert retention.needed() == "mysql-bin.000001"
