"""MySQL/MariaDB: connection settings and start-up preconditions (where reading may start:
``positions.py``).

Everything here runs in a worker thread (pymysql is blocking).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
import structlog

from deltaforge.sources.base import SourceError, SourceMisconfigured, SourceUnavailable
from deltaforge.sources.mysql.cascades import cascaded
from deltaforge.sources.mysql.connection import Connection
from deltaforge.sources.mysql.names import matches

# Client and server error codes that mean "the server cannot take us right now": can't connect
# (2002, 2003), gone away or lost mid-query (2006, 2013, 2055), shutting down (1053, 1077), the
# connection killed (1927), at its connection limits (1040 max_connections, 1203
# max_user_connections, 1226 a user's hourly limits) or this host blocked after connection errors
# until a FLUSH HOSTS (1129): all pass, or are mended on the server, without a change here.
UNAVAILABLE_CODES = frozenset({2002, 2003, 2006, 2013, 2055, 1053, 1077, 1927, 1040, 1203, 1226, 1129})


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (from pymysql, in this process or the decoder's) means the server is down."""
    if isinstance(exc, pymysql.err.OperationalError | pymysql.err.InterfaceError):
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        return code in UNAVAILABLE_CODES or isinstance(exc, pymysql.err.InterfaceError)
    return isinstance(exc, OSError | TimeoutError | EOFError)


@dataclass(frozen=True, slots=True)
class MySQLSettings:
    """Parsed ``mysql://user:password@host:port/db`` (the password never appears in messages)."""

    host: str
    port: int
    user: str
    password: str
    database: str
    query_timeout_s: float = 60.0
    """A short connection's reads and writes give up after this: a network that stops passing
    anything without closing (a dead route) is unavailable, not a thread held forever."""
    stall_s: float = 10.0
    """The replication stream's: the server sends a heartbeat every 50 ms when idle, so this
    long without a byte is a dead connection."""

    @classmethod
    def from_dsn(cls, dsn: str) -> MySQLSettings:
        parts = urlsplit(dsn)
        if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
            raise ValueError("expected mysql://user:password@host:port/db")
        return cls(
            host=parts.hostname,
            port=parts.port or 3306,
            user=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
            database=parts.path.lstrip("/"),
        )

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def replication(self) -> dict[str, str | int | float]:
        return {
            "host": self.host, "port": self.port, "user": self.user, "password": self.password,
            "read_timeout": self.stall_s, "write_timeout": self.stall_s,
        }  # fmt: skip

    def connect(self) -> pymysql.connections.Connection[Any]:
        try:
            return Connection(
                host=self.host, port=self.port, user=self.user, password=self.password, connect_timeout=10,
                read_timeout=self.query_timeout_s, write_timeout=self.query_timeout_s, autocommit=True,
            )  # fmt: skip
        except pymysql.err.OperationalError as exc:
            code = exc.args[0] if exc.args else 0
            if code in (1044, 1045):
                raise SourceMisconfigured(
                    f"mysql {self.where}: access denied (check user and password)"
                ) from None
            if code in UNAVAILABLE_CODES:
                raise SourceUnavailable(f"mysql {self.where}: cannot connect: {exc.args[-1]}") from None
            raise SourceError(f"mysql {self.where}: cannot connect: {exc.args[-1]}") from None


def default_server_id(source_id: str) -> int:
    """A stable replica server id per source, away from the small ids servers use."""
    return 100_000 + zlib.crc32(source_id.encode()) % 1_000_000


@dataclass(frozen=True, slots=True)
class ServerInfo:
    is_mariadb: bool
    version: str
    server_id: int
    gtid_binlog_pos: str
    names_fold_case: bool = False
    """``lower_case_table_names`` is 1 or 2: statements may name a table in any case."""


def _variables(cur: Any, names: list[str]) -> dict[str, str]:
    cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ",".join(["%s"] * len(names)) + ")", names)
    return {str(k).lower(): str(v) for k, v in cur.fetchall()}


_REQUIRED = (
    ("log_bin", "ON", "log_bin=ON (start the server with --log-bin)"),
    ("binlog_format", "ROW", "binlog_format=ROW (--binlog-format=ROW)"),
    ("binlog_row_image", "FULL", "binlog_row_image=FULL (--binlog-row-image=FULL)"),
    (
        "binlog_row_metadata",
        "FULL",
        "binlog_row_metadata=FULL (--binlog-row-metadata=FULL; MariaDB >= 10.5, MySQL >= 8.0.14)",
    ),
)


def check_preconditions(
    conn: Any, where: str, captured: Sequence[tuple[str, ...]] = (), cascades: str = "refuse"
) -> ServerInfo:
    """Binlog on, ROW format, FULL row image and metadata, the CDC privileges, no binlog filter
    keeping a captured database out of the binlog, and no captured table changed by foreign-key
    actions the binlog does not carry (``cascades``: refuse, or warn) — or say what to set."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION(), @@server_id")
        version, server_id = cur.fetchone()
        mariadb = "mariadb" in str(version).lower()
        compression = ["log_bin_compress", "binlog_transaction_compression"]
        relay = ["log_slave_updates", "log_replica_updates"]
        extra = [
            "gtid_binlog_pos",
            "lower_case_table_names",
            "binlog_row_value_options",
            *compression,
            *relay,
            "innodb_native_foreign_keys",
            "sync_binlog",
            "innodb_flush_log_at_trx_commit",
        ]
        values = _variables(cur, [name for name, _, _ in _REQUIRED] + extra)
        problems = []
        for name, want, how in _REQUIRED:
            got = values.get(name)
            if got is None:
                problems.append(f"{name} is not supported by server {version}; set {how}")
            elif got.upper() not in (want, "1" if want == "ON" else want):
                problems.append(f"{name} is {got}; set {how}")
        for name in compression:
            if values.get(name, "OFF").upper() in ("ON", "1"):
                problems.append(
                    f"{name} is ON; set {name}=OFF (compressed binlog events cannot be decoded, so their rows "
                    "would be lost)"
                )
        if "PARTIAL_JSON" in values.get("binlog_row_value_options", "").upper():
            problems.append(
                "binlog_row_value_options is PARTIAL_JSON; set binlog_row_value_options='' (a partial JSON "
                "update carries only the changed part of a document, so its row could not be delivered whole)"
            )
        logged = any(values.get(name, "OFF").upper() in ("ON", "1") for name in relay)
        if not logged and _replicating(cur, mariadb):
            problems.append(
                "this server is a replica (its replication is running) with log_slave_updates=OFF: what it "
                "applies from its primary is not written to its own binlog, so it would never be captured; "
                "set log_slave_updates=ON (--log-slave-updates), or read from the primary"
            )
        cur.execute("SHOW GRANTS")
        grants = " ".join(str(r[0]).upper() for r in cur.fetchall())
    if "ALL PRIVILEGES ON *.*" not in grants:
        need = [
            ("REPLICATION SLAVE", ("REPLICATION SLAVE", "REPLICATION REPLICA")),
            (
                "BINLOG MONITOR" if mariadb else "REPLICATION CLIENT",
                ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER"),
            ),
            ("SELECT", ("SELECT",)),
        ]
        missing = [label for label, options in need if not any(o in grants for o in options)]
        if missing:
            problems.append(
                f"user lacks {', '.join(missing)}; GRANT {', '.join(missing)} ON *.* TO the CDC user"
            )
    fold = values.get("lower_case_table_names", "0") != "0"
    if not problems:  # the binlog status needs the rights checked above
        problems += _filtered_out(conn, captured)
    # MySQL >= 9.6 makes referential actions in the SQL layer by default, and logs them as rows.
    if not problems and values.get("innodb_native_foreign_keys", "ON").upper() in ("ON", "1"):
        problems += cascaded(conn, captured, fold, cascades)
    if problems:
        raise SourceMisconfigured(f"mysql {where} is not ready for CDC: " + "; ".join(problems))
    _name_unmatched(conn, captured, fold)
    _name_risks(values, where)
    return ServerInfo(mariadb, str(version), int(server_id), values.get("gtid_binlog_pos", ""), fold)


_RISKS = (
    (
        "sync_binlog",
        "the server acknowledges a commit before its binlog is on disk, so a crash of its machine can lose "
        "transactions deltaforge has already delivered (a checkpoint past the binlog's end then stops the "
        "pipeline as position lost)",
    ),
    (
        "innodb_flush_log_at_trx_commit",
        "InnoDB acknowledges a commit before its log is on disk, so a crash of the server's machine can lose "
        "committed transactions its binlog, and so deltaforge, already has",
    ),
)
"""Settings other than 1 under which a crash of the server's machine loses what deltaforge delivered."""


def _name_risks(values: dict[str, str], where: str) -> None:
    """Log the :data:`_RISKS` settings that are not 1: the sinks may then hold changes the database
    no longer has after a crash. A setting the server does not show is not named."""
    for name, why in _RISKS:
        got = values.get(name)
        if got is not None and got != "1":
            structlog.get_logger().warning(
                "source_durability",
                actor="MySQLSource",
                server=where,
                risk=f"{name} is {got}: {why}; set {name}=1",
            )


def _replicating(cur: Any, mariadb: bool) -> bool:
    """Whether the server applies changes from a primary now (readable by the CDC user; a server
    that will not say counts as not replicating)."""
    try:
        if mariadb:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Slaves_running'")
            row = cur.fetchone()
            return row is not None and int(row[1]) > 0
        cur.execute(
            "SELECT COUNT(*) FROM performance_schema.replication_applier_status WHERE SERVICE_STATE = 'ON'"
        )
        return int(cur.fetchone()[0]) > 0
    except (pymysql.err.MySQLError, ValueError, TypeError):
        return False


_PARSE_ERROR = 1064


def binlog_status(cur: Any) -> tuple[Any, ...] | None:
    """The server's binlog status row (file, position, Binlog_Do_DB, Binlog_Ignore_DB, ...):
    ``SHOW BINARY LOG STATUS`` on MySQL >= 8.2 (8.4 removed ``SHOW MASTER STATUS``), else, where
    that does not parse (MariaDB, older MySQL), ``SHOW MASTER STATUS``; as python-mysql-replication
    itself asks."""
    try:
        cur.execute("SHOW BINARY LOG STATUS")
    except pymysql.err.ProgrammingError as exc:
        if not exc.args or exc.args[0] != _PARSE_ERROR:
            raise
        cur.execute("SHOW MASTER STATUS")
    row = cur.fetchone()
    return tuple(row) if row is not None else None


def _filtered_out(conn: Any, captured: Sequence[tuple[str, ...]]) -> list[str]:
    """Captured databases the server's binlog filters (``binlog_do_db``, ``binlog_ignore_db``)
    keep out of the binlog: their changes are never written, so a reader would wait for them for
    ever and see nothing. A database named by a glob cannot be told: the filter is logged."""
    with conn.cursor() as cur:
        row = binlog_status(cur)
    if row is None or len(row) < 4:  # binary logging off (refused above) or an unknown layout
        return []
    do = [d for d in str(row[2] or "").split(",") if d]
    ignore = [d for d in str(row[3] or "").split(",") if d]
    if not do and not ignore:
        return []
    problems = []
    dbs = sorted({p[0] for p in captured})
    if not dbs or any(any(ch in db for ch in "*?[") for db in dbs):
        structlog.get_logger().warning(
            "binlog_filtered", actor="MySQLSource", binlog_do_db=do, binlog_ignore_db=ignore,
            reason="tables in databases these filters leave out are never in the binlog, so never captured",
        )  # fmt: skip
    for db in dbs:
        if any(ch in db for ch in "*?["):
            continue
        if db in ignore:
            problems.append(
                f"binlog_ignore_db lists {db!r}, so changes to its tables are never written to the binlog; "
                f"remove --binlog-ignore-db={db} from the server's settings"
            )
        elif do and db not in do:
            problems.append(
                f"binlog_do_db is {','.join(do)}, so changes to {db!r} are never written to the binlog; "
                f"add --binlog-do-db={db} to the server's settings (or remove the filter)"
            )
    return problems


def _name_unmatched(conn: Any, captured: Sequence[tuple[str, ...]], fold: bool) -> None:
    """Log the entries of ``tables`` no table matches now. Capture goes by name, so a table
    created later is captured from then on; but a misspelt name captures nothing, and nothing
    else would say so (PostgreSQL's publication refuses such a name)."""
    if not captured:
        return
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
            "AND TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')"
        )
        existing = [(str(db), str(table)) for db, table in cur.fetchall()]
    unmatched = [
        ".".join(p) for p in captured if not any(matches([p], db, table, fold) for db, table in existing)
    ]
    if unmatched:
        structlog.get_logger().warning(
            "captured_tables_not_found", actor="MySQLSource", tables=unmatched,
            reason="no table matches these entries of tables: their changes are captured once such a table "
            "exists, but a misspelt name captures nothing",
        )  # fmt: skip
