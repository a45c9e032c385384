"""What stops the MySQL/MariaDB source, and what it says: a lost position, wrong settings or
rights, compressed or damaged binlog events (never skipped)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest
from structlog.testing import capture_logs

from deltaforge.events import Event
from deltaforge.sources.base import PositionLost, SourceError, SourceMisconfigured
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.source import MySQLSource
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import damage_on_disk, restarts, wait_until
from tests.mysql_kit import fresh_db, purge_all_but_newest, read_n, source, to_file
from tests.servers.mariadb import CDC_PASSWORD, CDC_USER, MariaDB


@pytest.mark.parametrize("resume_by", ["auto", "file"])
async def test_purged_binlog_is_position_lost(mariadb: MariaDB, resume_by: str) -> None:
    """A transaction after the checkpoint went with the binlog file it was in: by GTID (the
    oldest file left starts past the checkpoint's state) and by file alike."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1)")
    src = source(mariadb, [f"{db}.t"], resume_by=resume_by)
    await src.open(None)
    [ev] = await read_n(src, 1)
    await src.close()
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (2)")  # lands in the file about to go
    purge_all_but_newest(mariadb, ev.checkpoint.file)
    src2 = source(mariadb, [f"{db}.t"], resume_by=resume_by)
    with pytest.raises(PositionLost) as info:
        await src2.open(ev.checkpoint)
    msg = str(info.value)
    assert msg.startswith(f"position lost: binlog file {ev.checkpoint.file} is no longer on the server")
    assert msg.endswith("Re-snapshot required.")


async def test_a_caught_up_checkpoint_whose_binlog_file_was_purged_resumes_by_gtid(mariadb: MariaDB) -> None:
    """Nothing was written after the checkpoint before its file was rotated and purged (``FLUSH
    BINARY LOGS`` then ``PURGE BINARY LOGS TO`` the new file: ``mysqldump --flush-logs
    --delete-master-logs``, a backup script, on a quiet server): by GTID nothing is missing, the
    newest file's GTID list holds the checkpoint's state. It was a false position lost: a
    pipeline restarted then halted, asking for a re-snapshot it did not need (an optional sink
    lagging behind at that checkpoint was parked for good). It resumes; by file the position is
    lost, as the file it names is gone."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    [ev] = await read_n(src, 1)
    await src.close()
    purge_all_but_newest(mariadb, ev.checkpoint.file)
    again = source(mariadb, [f"{db}.t"])
    await again.open(ev.checkpoint)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (2)")
    assert [e.after for e in await read_n(again, 1)] == [{"id": 2}]
    await again.close()
    with pytest.raises(PositionLost, match=f"binlog file {ev.checkpoint.file} is no longer on the server"):
        await source(mariadb, [f"{db}.t"], resume_by="file").open(ev.checkpoint)


async def test_gtid_ahead_of_server_is_position_lost(mariadb: MariaDB) -> None:
    src = source(mariadb, ["x.t"])
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file = cur.fetchone()[0]
    with pytest.raises(PositionLost, match=r"GTID 0-1-999999 is ahead of the server's binlog state"):
        await src.open(src.load_position({"file": file, "pos": 4, "row": 0, "gtid": "0-1-999999"}))


async def test_a_binlog_that_lost_its_end_in_a_crash_is_position_lost() -> None:
    """With sync_binlog other than 1 (MariaDB's default) a crash of the server's machine loses
    the end of the binlog that was not on disk yet, which deltaforge may have read and delivered.
    The server then starts a new binlog file and writes new transactions under the lost ones'
    GTIDs: a reader resuming from its GTID position took them as read and skipped them, without
    a word. The checkpoint's file now ends before the checkpoint: position lost. SIGKILL and the
    file cut at a transaction's start stand in for the machine's crash and its lost page cache."""
    with MariaDB() as server:
        db = fresh_db(server)
        with server.root(db) as c, c.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))")
            for i in range(1, 21):
                cur.execute(f"INSERT INTO t VALUES ({i}, 'before the crash')")
        src = source(server, [f"{db}.t"])
        await src.open(None)
        last = (await read_n(src, 20))[-1].checkpoint
        await src.close()
        with server.root() as c, c.cursor() as cur:
            cur.execute("SHOW BINLOG EVENTS IN %s", (last.file,))
            cut = [int(e[1]) for e in cur.fetchall() if e[2] == "Gtid"][-10]  # ten never reached the disk
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        os.truncate(server.data / last.file, cut)
        server.resume()
        with server.root(db) as c, c.cursor() as cur:
            for i in range(11, 26):
                cur.execute(f"REPLACE INTO t VALUES ({i}, 'after the crash')")
        seq = int(last.gtid.split("-")[2])
        assert int(server.gtid_binlog_pos().split("-")[2]) > seq  # the GTIDs alone look fine
        with pytest.raises(PositionLost) as info:
            await source(server, [f"{db}.t"]).open(last)
    assert str(info.value).startswith(
        f"position lost: binlog file {last.file} ends at {cut}, before the checkpoint's position {last.pos}: "
        "the server lost the end of it"
    )


async def test_settings_that_can_lose_what_was_delivered_are_named_at_every_start(mariadb: MariaDB) -> None:
    """A server that acknowledges a commit before its binlog (or InnoDB's log) is on disk can
    lose, in a crash of its machine, transactions deltaforge has delivered: the sinks then hold
    changes the database no longer has. Each start names such a setting (MariaDB's default
    sync_binlog=0 is one); with both at 1 nothing is said."""
    db = fresh_db(mariadb)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SELECT @@sync_binlog, @@innodb_flush_log_at_trx_commit")
        was = cur.fetchone()
    said: list[list[str]] = []
    try:
        for values in ((0, 2), (1, 1)):
            with mariadb.root() as c, c.cursor() as cur:
                cur.execute(f"SET GLOBAL sync_binlog = {values[0]}")
                cur.execute(f"SET GLOBAL innodb_flush_log_at_trx_commit = {values[1]}")
            src = source(mariadb, [f"{db}.t"])
            with capture_logs() as logs:
                await src.open(None)
            await src.close()
            said.append([e["risk"] for e in logs if e["event"] == "source_durability"])
    finally:
        with mariadb.root() as c, c.cursor() as cur:
            cur.execute(f"SET GLOBAL sync_binlog = {was[0]}")
            cur.execute(f"SET GLOBAL innodb_flush_log_at_trx_commit = {was[1]}")
    assert [r.split(":")[0] for r in said[0]] == ["sync_binlog is 0", "innodb_flush_log_at_trx_commit is 2"]
    assert "set sync_binlog=1" in said[0][0] and "set innodb_flush_log_at_trx_commit=1" in said[0][1]
    assert said[1] == []


async def test_missing_privileges_are_named(mariadb: MariaDB) -> None:
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'weak'@'%' IDENTIFIED BY 'weak-pw'")
        cur.execute("GRANT SELECT ON *.* TO 'weak'@'%'")
    src = MySQLSource(MySQLSourceConfig(id="w", dsn=mariadb.dsn(user="weak", password="weak-pw")))
    with pytest.raises(SourceMisconfigured) as info:
        await src.open(None)
    assert "user lacks REPLICATION SLAVE, BINLOG MONITOR" in str(info.value)
    assert "weak-pw" not in str(info.value)


async def test_wrong_password_is_clear_and_does_not_leak(mariadb: MariaDB) -> None:
    src = MySQLSource(MySQLSourceConfig(id="w", dsn=mariadb.dsn(password="not-the-pw")))
    with pytest.raises(SourceMisconfigured, match="access denied") as info:
        await src.open(None)
    assert "not-the-pw" not in str(info.value)


def test_statement_format_fails_at_start_saying_what_to_set() -> None:
    with MariaDB(extra_args=["--binlog-format=STATEMENT"], server_id=7) as server:
        src = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn()))
        with pytest.raises(SourceMisconfigured) as info:
            asyncio.run(src.open(None))
    msg = str(info.value)
    assert "binlog_format is STATEMENT; set binlog_format=ROW (--binlog-format=ROW)" in msg


def test_compressed_binlog_is_refused_at_start_saying_what_to_set() -> None:
    with MariaDB(extra_args=["--log-bin-compress=ON"], server_id=8) as server:
        src = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn()))
        with pytest.raises(SourceMisconfigured) as info:
            asyncio.run(src.open(None))
    assert "log_bin_compress is ON; set log_bin_compress=OFF" in str(info.value)


def test_a_captured_database_the_binlog_filters_leave_out_is_refused_at_start() -> None:
    """``binlog_ignore_db`` (or a ``binlog_do_db`` list without it) keeps a database's changes
    out of the binlog: a source capturing it read nothing, for ever, and said nothing. It is
    refused at start, naming the filter; a database the filters let through starts as before."""
    with MariaDB(extra_args=["--binlog-ignore-db=secret"], server_id=11) as server:
        src = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn(), tables=["secret.t", "shop.t"]))
        with pytest.raises(SourceMisconfigured) as ignored:
            asyncio.run(src.open(None))
        fine = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn(), tables=["shop.t"]))
        asyncio.run(fine.open(None))
        asyncio.run(fine.close())
    assert "binlog_ignore_db lists 'secret'" in str(ignored.value)
    assert "remove --binlog-ignore-db=secret" in str(ignored.value)
    assert "shop" not in str(ignored.value)
    with MariaDB(extra_args=["--binlog-do-db=shop"], server_id=12) as server:
        src = MySQLSource(MySQLSourceConfig(id="s", dsn=server.dsn(), tables=["crm.people"]))
        with pytest.raises(SourceMisconfigured) as not_done:
            asyncio.run(src.open(None))
    assert "binlog_do_db is shop, so changes to 'crm' are never written to the binlog" in str(not_done.value)


async def test_a_table_changed_by_foreign_key_cascades_is_refused_at_start_unless_accepted(
    mariadb: MariaDB,
) -> None:
    """InnoDB makes a foreign key's referential actions (ON DELETE CASCADE, SET NULL, ON UPDATE
    CASCADE) itself, and they are not in the binlog: a parent's delete is logged, its children's
    are not (MariaDB's replication docs; MySQL before 9.6 handles keys the same way). A captured
    child table kept every cascaded-away row in every sink, in silence. Refused at start naming
    the key; ``foreign_key_cascades: warn`` starts and names it in the log; the parent alone, and
    a key without actions, are fine."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE p (id INT PRIMARY KEY)")
        cur.execute(
            "CREATE TABLE ch (id INT PRIMARY KEY, p INT, CONSTRAINT ch_p FOREIGN KEY (p) REFERENCES p (id) "
            "ON DELETE CASCADE ON UPDATE SET NULL)"
        )
        cur.execute("CREATE TABLE plain (id INT PRIMARY KEY, p INT, FOREIGN KEY (p) REFERENCES p (id))")
    with pytest.raises(SourceMisconfigured) as refused:
        await source(mariadb, [f"{db}.*"]).open(None)
    for fine in (
        source(mariadb, [f"{db}.p", f"{db}.plain"]),
        source(mariadb, [f"{db}.*"], foreign_key_cascades="warn"),
    ):
        with capture_logs() as logs:
            await fine.open(None)
        await fine.close()
    message = str(refused.value)
    assert (
        f"{db}.ch is changed by foreign key ch_p (ON DELETE CASCADE, ON UPDATE SET NULL from {db}.p)"
        in message
    )
    assert "set foreign_key_cascades: warn" in message and "plain" not in message
    warned = [e for e in logs if e["event"] == "foreign_key_cascades_not_logged"]
    assert warned and warned[0]["keys"] == [
        f"{db}.ch: ch_p (ON DELETE CASCADE, ON UPDATE SET NULL from {db}.p)"
    ]


async def test_entries_of_tables_no_table_matches_are_named_at_every_start(mariadb: MariaDB) -> None:
    """Capture goes by name, so a misspelt entry of ``tables`` captured nothing while the pipeline
    ran as if all were well. Each start names the entries no table matches; a table created later
    under such a name is still captured."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE lines_2024 (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.orders", f"{db}.order", f"{db}.lines_*", f"{db}.notes_*", "nodb.*"])
    with capture_logs() as logs:
        await src.open(None)
    warned = [e for e in logs if e["event"] == "captured_tables_not_found"]
    assert len(warned) == 1 and warned[0]["tables"] == [f"{db}.order", f"{db}.notes_*", "nodb.*"]
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE `order` (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO `order` VALUES (7)")
    [ev] = await read_n(src, 1)
    await src.close()
    assert (ev.table, ev.after) == ("order", {"id": 7})


def test_referential_actions_are_read_from_the_servers_create_table_whatever_the_names() -> None:
    """The actions come from SHOW CREATE TABLE (MariaDB hides REFERENTIAL_CONSTRAINTS from a user
    with SELECT only); a name that reads like an action is not one."""
    from deltaforge.sources.mysql.cascades import referential_actions

    text = (
        "CREATE TABLE `c` (\n  `x ON DELETE CASCADE` int(11) DEFAULT NULL,\n  `p` int(11) DEFAULT NULL,\n"
        "  CONSTRAINT `odd``name` FOREIGN KEY (`x ON DELETE CASCADE`) REFERENCES `q` (`id`),\n"
        "  CONSTRAINT `fk` FOREIGN KEY (`p`) REFERENCES `other`.`p` (`id`) ON UPDATE CASCADE\n"
        ") ENGINE=InnoDB"
    )
    assert referential_actions(text) == {"odd`name": [], "fk": ["ON UPDATE CASCADE"]}


def test_a_replica_that_does_not_log_what_it_applies_is_refused_at_start() -> None:
    """Reading a replica started without log_slave_updates read none of what it replicated (it
    is not in its binlog), for ever, in silence. Refused at start, saying what to set; a replica
    that logs it is read as before."""
    with MariaDB(server_id=31) as primary:
        with primary.replica(log_updates=False) as replica:
            src = MySQLSource(MySQLSourceConfig(id="r", dsn=replica.dsn(), tables=["shop.t"]))
            with pytest.raises(SourceMisconfigured) as info:
                asyncio.run(src.open(None))
        with primary.replica() as logging_replica:
            fine = MySQLSource(MySQLSourceConfig(id="r", dsn=logging_replica.dsn(), tables=["shop.t"]))
            asyncio.run(fine.open(None))
            asyncio.run(fine.close())
    assert "this server is a replica (its replication is running) with log_slave_updates=OFF" in str(
        info.value
    )


async def streaming_z_t(server: MariaDB, note: str = "plain") -> MySQLSource:
    """``z.t`` made on ``server`` holding ``(1, note)``, and a source reading it that has read that
    row (its reading is up, from before what the test does next)."""
    with server.root() as c, c.cursor() as cur:
        cur.execute("CREATE DATABASE z")
        cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY, note VARCHAR(200))")
        cur.execute("INSERT INTO z.t VALUES (1, %s)", (note,))
    src = source(server, ["z.t"])
    await src.open(None)
    first = await read_n(src, 1)
    assert first[0].after == {"id": 1, "note": note}
    return src


def halted_once_set(server_id: int, settings: list[str], note: str) -> str:
    """What stops a source reading ``z.t`` on a server of its own at the row ``(2, note)``, written
    in a new session after ``SET GLOBAL`` of each of ``settings`` (a delivery fails the test)."""

    async def scenario(server: MariaDB) -> str:
        src = await streaming_z_t(server)
        with server.root() as c, c.cursor() as cur:
            for setting in settings:
                cur.execute(f"SET GLOBAL {setting}")
        with server.root() as c, c.cursor() as cur:  # a new session: the settings apply
            cur.execute("INSERT INTO z.t VALUES (2, %s)", (note,))
        try:
            with pytest.raises(SourceMisconfigured) as info:
                got = await read_n(src, 1)
                raise AssertionError(f"delivered {[e.after for e in got]}")
            return str(info.value)
        finally:
            await src.close()

    with MariaDB(server_id=server_id) as server:
        return asyncio.run(scenario(server))


def test_compressed_events_met_while_reading_halt_with_their_coordinates_never_skip() -> None:
    """Compression switched on while the reader runs: rows it cannot decode stop it, with where."""

    msg = halted_once_set(9, ["log_bin_compress_min_len = 10", "log_bin_compress = ON"], "x" * 150)
    assert "a MariaDB compressed" in msg and "at mysql-bin.000001:" in msg
    assert "set log_bin_compress=OFF" in msg


def test_table_maps_without_column_names_met_while_reading_halt_with_their_coordinates() -> None:
    """``binlog_row_metadata`` switched from FULL while the reader runs (it is checked at start):
    the table maps after it carry no column names and no primary key, and the rows were delivered
    as ``{'UNKNOWN_COL0': 2, 'UNKNOWN_COL1': 'b'}``, without a key, in silence. They stop it now,
    saying where and what to set; what came before is delivered."""

    msg = halted_once_set(13, ["binlog_row_metadata = MINIMAL"], "b")
    assert "the table map of z.t at mysql-bin.000001:" in msg and "no column names" in msg
    assert "set binlog_row_metadata=FULL" in msg


def test_binlog_checksum_switched_while_reading_or_between_files_is_read_through() -> None:
    """``binlog_checksum`` is the server's to change (MariaDB rotates to a new file when it does),
    and each file says its own in its format description. The binlog library took the setting
    once, at connecting: switched to NONE while reading, the next file's events failed their
    CRC32 and the pipeline halted calling them damaged; opened from a file written with CRC32
    while the setting was NONE, the server refused the library, which had not said it reads
    checksums, and it halted as position lost. Now each file is read as its format description
    says, whichever way the setting went, in a reading and across openings."""

    async def scenario(server: MariaDB) -> tuple[list[Any], list[Any]]:
        src = await streaming_z_t(server, "crc")
        with server.root() as c, c.cursor() as cur:
            cur.execute("SET GLOBAL binlog_checksum = NONE")
            cur.execute("INSERT INTO z.t VALUES (2, 'none')")
            cur.execute("SET GLOBAL binlog_checksum = CRC32")
            cur.execute("INSERT INTO z.t VALUES (3, 'crc again')")
            cur.execute("SET GLOBAL binlog_checksum = NONE")
            cur.execute("INSERT INTO z.t VALUES (4, 'none again')")
        try:
            got = await read_n(src, 3)
        finally:
            await src.close()
        again = source(server, ["z.t"])  # the setting NONE, the first file CRC32
        await again.open(again.load_position({"file": "mysql-bin.000001", "pos": 4, "row": 0, "gtid": ""}))
        try:
            reread = await read_n(again, 4)
        finally:
            await again.close()
        return [e.after for e in got], [e.after for e in reread]

    with MariaDB(server_id=15) as server:
        got, reread = asyncio.run(scenario(server))
    rows = [{"id": 2, "note": "none"}, {"id": 3, "note": "crc again"},
            {"id": 4, "note": "none again"}]  # fmt: skip
    assert got == rows
    assert reread == [{"id": 1, "note": "crc"}, *rows]


def test_a_damaged_binlog_event_stops_the_source_and_its_rows_are_never_delivered() -> None:
    """A byte changed in a closed binlog file on the server's disk. MariaDB's dump thread sends it
    as it is (master_verify_checksum is OFF by default); the event fails its CRC32, so reading
    fails saying where, and the damaged row never becomes an event."""

    async def scenario(server: MariaDB) -> str:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE z")
            cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY, note VARCHAR(200))")
            cur.execute("INSERT INTO z.t VALUES (1, 'plain')")
            cur.execute("INSERT INTO z.t VALUES (2, 'the original note')")
            cur.execute("FLUSH BINARY LOGS")  # mysql-bin.000001 is closed: nothing writes it again
        damage_on_disk(server.data / "mysql-bin.000001", b"the original note")
        src = source(server, ["z.t"])
        await src.open(src.load_position({"file": "mysql-bin.000001", "pos": 4, "row": 0, "gtid": ""}))
        try:
            seen: list[Event] = []
            with pytest.raises(SourceError) as info:
                while len(seen) < 2:  # the damaged row, delivered, ends it too
                    seen.extend(e for e in await src.read() if e.op != "h")
            assert [e.after for e in seen] == [{"id": 1, "note": "plain"}]
            return str(info.value)
        finally:
            await src.close()

    with MariaDB(server_id=11) as server:
        msg = asyncio.run(scenario(server))
    assert "the binlog event at mysql-bin.000001:" in msg and "does not match its CRC32 checksum" in msg


def test_a_pipeline_meeting_a_damaged_binlog_event_halts_saying_where_after_what_came_before(
    tmp_path: Path,
) -> None:
    """Through the pipeline: it resumes from its checkpoint into a damaged event, restarts its
    source (a damage in transit would be cured), then halts with the event's coordinates; the
    file holds what came before it and none of the damaged row."""

    async def scenario(server: MariaDB) -> str | None:
        with server.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE z")
            cur.execute("CREATE TABLE z.t (id INT PRIMARY KEY, note VARCHAR(200))")
            cur.execute("INSERT INTO z.t VALUES (1, 'plain')")
        out, store = tmp_path / "events.jsonl", MemoryCheckpointStore()
        runner = to_file(server, "crc", "z.t", out, store)  # no checkpoint: from the oldest binlog
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed >= 1, timeout=30, what="row 1")
        await runner.drain()
        await task
        with server.root() as c, c.cursor() as cur:
            cur.execute("INSERT INTO z.t VALUES (2, 'the original note')")
            cur.execute("FLUSH BINARY LOGS")
        damage_on_disk(server.data / "mysql-bin.000001", b"the original note")
        runner = to_file(server, "crc", "z.t", out, store)
        task = asyncio.create_task(runner.run())

        def ids() -> list[int]:
            return [orjson.loads(x)["after"]["id"] for x in out.read_bytes().splitlines()]

        await wait_until(lambda: task.done() or len(ids()) > 1, timeout=120, what="a halt (or row 2)")
        if not task.done():  # the damaged row was delivered: stop, then fail below
            await runner.drain()
            await task
        assert ids() == [1]
        assert runner.state == "failed"
        return runner.failure

    with MariaDB(server_id=12) as server:
        reason = asyncio.run(scenario(server))
    assert reason is not None and "does not match its CRC32 checksum" in reason, reason
    assert "the binlog event at mysql-bin.000001:" in reason


def test_the_binlog_status_is_asked_as_each_server_understands_it() -> None:
    """MySQL 8.4 (the compose file's server) removed SHOW MASTER STATUS; MariaDB does not parse
    SHOW BINARY LOG STATUS. No MySQL server runs here, so a cursor that answers as each does
    stands in for it; MariaDB's way is proven on the real server by the tests above (the binlog
    filter check and the snapshot's start position both ask it)."""
    import pymysql

    from deltaforge.sources.mysql.checks import binlog_status

    class Server:
        def __init__(self, knows: str) -> None:
            self.knows, self.asked, self.row = knows, [], None

        def execute(self, sql: str) -> None:
            self.asked.append(sql)
            if sql != self.knows:
                raise pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax")
            self.row = ("mysql-bin.000003", 157, "", "")

        def fetchone(self) -> tuple[str, int, str, str] | None:
            return self.row

    mysql84, mariadb = Server("SHOW BINARY LOG STATUS"), Server("SHOW MASTER STATUS")
    assert binlog_status(mysql84) == binlog_status(mariadb) == ("mysql-bin.000003", 157, "", "")
    assert mysql84.asked == ["SHOW BINARY LOG STATUS"]
    assert mariadb.asked == ["SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"]


def test_partial_json_updates_are_refused_at_start_saying_what_to_set() -> None:
    """MySQL 8 can log a JSON update as the changed part of the document only
    (binlog_row_value_options=PARTIAL_JSON): such events were not even asked of the binlog
    reader, so those updates were skipped. Refused at start (and, met while reading because a
    session set it, the reader halts like on a compressed event). MariaDB has no such setting,
    and no MySQL server runs here: a connection answering as a MySQL 8.4 with it set stands in."""
    from deltaforge.sources.mysql.checks import check_preconditions

    answers = {
        "SELECT VERSION(), @@server_id": [("8.4.0", 1)],
        "SHOW GLOBAL VARIABLES": [
            ("log_bin", "ON"),
            ("binlog_format", "ROW"),
            ("binlog_row_image", "FULL"),
            ("binlog_row_metadata", "FULL"),
            ("binlog_row_value_options", "PARTIAL_JSON"),
            ("log_replica_updates", "ON"),
        ],
        "SHOW GRANTS": [("GRANT ALL PRIVILEGES ON *.* TO `cdc`@`%`",)],
        "SHOW BINARY LOG STATUS": [("binlog.000001", 157, "", "")],
        "SELECT DISTINCT TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME": [],  # no foreign keys
        "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES": [("shop", "t")],
    }

    class Cursor:
        rows: list[tuple[object, ...]] = []

        def __enter__(self) -> Cursor:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def execute(self, sql: str, params: object = None) -> None:
            self.rows = next(rows for start, rows in answers.items() if sql.startswith(start))

        def fetchone(self) -> tuple[object, ...] | None:
            return self.rows[0] if self.rows else None

        def fetchall(self) -> list[tuple[object, ...]]:
            return self.rows

    class Conn:
        def cursor(self) -> Cursor:
            return Cursor()

    with pytest.raises(SourceMisconfigured) as info:
        check_preconditions(Conn(), "127.0.0.1:3306", [("shop", "t")])
    assert "binlog_row_value_options is PARTIAL_JSON; set binlog_row_value_options=''" in str(info.value)
    answers["SHOW GLOBAL VARIABLES"][4] = ("binlog_row_value_options", "")
    assert check_preconditions(Conn(), "127.0.0.1:3306", [("shop", "t")]).version == "8.4.0"


async def test_pipelines_whose_sources_share_an_id_read_one_server_side_by_side(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    """Two pipelines whose MySQL sources have the same id (two services, each with its own store:
    ``my`` or ``shop`` is what everyone calls it) read one server at once: each connects as a
    replica with its own server id, so neither drops the other. Before, the server id came from
    the source id alone: the server dropped each reader as the other connected (MariaDB error
    4052), each was restarted, over and over, until a pipeline failed."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    runners = [to_file(mariadb, name, f"{db}.t", tmp_path / f"{name}.jsonl", MemoryCheckpointStore())
               for name in ("billing", "search")]  # fmt: skip
    tasks = [asyncio.create_task(r.run()) for r in runners]
    try:
        await wait_until(lambda: all(r.state == "running" for r in runners), timeout=30, what="both running")
        await wait_until(lambda: all(r.snapshot().find("SourceReader").state == "running" for r in runners),
                         timeout=30, what="both sources open")  # fmt: skip
        with mariadb.root(db) as c, c.cursor() as cur:
            for i in range(1, 21):  # in lockstep: each row read by both before the next is written
                cur.execute("INSERT INTO t VALUES (%s)", (i,))
                await wait_until(lambda i=i: all(r.ctx.stats.events_committed >= i or r.state == "failed"
                                                 for r in runners), timeout=60, what=f"row {i} in both")  # fmt: skip
        assert [r.state for r in runners] == ["running", "running"], [r.failure for r in runners]
        assert [restarts(r.snapshot()) for r in runners] == [0, 0]
    finally:
        for r, t in zip(runners, tasks, strict=True):
            r.stop_now()
            await asyncio.wait_for(t, 30)


async def test_a_server_id_another_replica_took_stops_the_source_saying_so(
    mariadb: MariaDB, tmp_path: Path
) -> None:
    """A ``server_id`` set to one another replica of the server uses (here another pipeline's):
    the server refuses whichever connects while the other is connected, and retrying would only
    take turns at it (a real replica of that id would lose its connection each time). The refused
    pipeline stops, naming the id and the setting. Before, it was restarted over and over until
    its restart intensity ran out, with the server's words alone (and MySQL sends them as 1236,
    which read as a lost position: a re-snapshot under ``when_needed``)."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    runners = []
    for name in ("billing", "search"):
        r = to_file(mariadb, name, f"{db}.t", tmp_path / f"{name}.jsonl", MemoryCheckpointStore())
        r.source.chosen_server_id = 4242  # as `server_id: 4242` in both configs
        runners.append(r)
    tasks = [asyncio.create_task(r.run()) for r in runners]
    try:
        await wait_until(lambda: any(r.state == "failed" for r in runners), timeout=60, what="one stopped")
        [refused] = [r for r in runners if r.state == "failed"]
        assert refused.failure is not None and "server id 4242" in refused.failure, refused.failure
        assert "spec.source.config.server_id" in refused.failure and "position lost" not in refused.failure
        assert restarts(refused.snapshot()) == 0
    finally:
        for r, t in zip(runners, tasks, strict=True):
            r.stop_now()
            await asyncio.wait_for(t, 30)


async def test_a_server_at_its_connection_limit_is_waited_for_not_a_failure(tmp_path: Path) -> None:
    """A busy server refuses new connections past ``max_connections`` (MariaDB error 1040, "Too many
    connections"; per user 1203, per hour 1226, a blocked host 1129): it is there, and will take
    one once others close. The source is unavailable meanwhile (``degraded``, saying so) and
    reads once a connection is free. Before, each refusal was a crash: the pipeline failed within
    seconds, after its restarts ran out."""
    with MariaDB() as server:  # its own: the limit would refuse the other tests' connections
        db = fresh_db(server)
        with server.root(db) as c, c.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
            cur.execute("INSERT INTO t VALUES (1)")
        with server.root() as c, c.cursor() as cur:
            cur.execute("SET GLOBAL max_connections = 10")  # MariaDB's least
        hogs: list[Any] = []
        while True:
            try:
                hogs.append(
                    pymysql.connect(host="127.0.0.1", port=server.port, user=CDC_USER, password=CDC_PASSWORD)
                )
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1040, exc
                break
        runner = to_file(server, "busy", f"{db}.t", tmp_path / "out.jsonl", MemoryCheckpointStore())
        task = asyncio.create_task(runner.run())
        try:

            def said() -> str:
                return str(runner.ctx.availability.view().get("source", {}).get("last_error", ""))

            await wait_until(lambda: "Too many connections" in said() or runner.state == "failed", timeout=30,
                             what="the source listed unavailable")  # fmt: skip
            assert runner.state == "running", runner.failure
            while hogs:
                hogs.pop().close()
            await wait_until(
                lambda: runner.ctx.stats.events_committed >= 1, timeout=60, what="the row delivered"
            )
            assert runner.state == "running" and not runner.ctx.availability.degraded
        finally:
            runner.stop_now()
            await asyncio.wait_for(task, 30)
            for hog in hogs:
                hog.close()
