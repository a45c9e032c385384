"""The decoder child's replication stream: how it is opened, which tables it captures, and how
its events are read (the loop that decodes them is ``decoder.py``'s)."""

from __future__ import annotations

import fnmatch
import ssl
from collections.abc import Iterator
from typing import Any, TypedDict

from deltaforge.position import PositionDoc
from deltaforge.sources.mysql.position import BinlogPosition


class DecoderSettings(TypedDict):
    """What the reader hands this process (pickled on its stdin)."""

    connection: dict[str, str | int | float]
    server_id: int
    is_mariadb: bool
    by_file: bool
    resume: PositionDoc
    patterns: list[tuple[str, ...]]
    schemas: list[str]
    chunk: int
    fold_case: bool
    envelopes: dict[str, Any] | None
    """``connector``, ``tenant`` and ``gen`` when the child makes each change's native envelope
    (txevents.py), else None."""


HEARTBEAT_S = 0.05  # the server says it is alive when quiet (and a finished transaction goes on)


def open_reader(
    cfg: DecoderSettings, resume: BinlogPosition, only_events: list[type], checksums: ChecksumsPerFile
) -> Any:
    """A blocking ``BinLogStreamReader`` (``checksums``' own) from ``resume``, for the event classes
    the decoder reads (``only_events``: it imports them for its own loop, and lists
    ``checksums.event`` among them)."""
    from pymysqlreplication import binlogstream

    from deltaforge.sources.mysql.connection import Connection

    # The library reconnects by itself after a lost connection (2013, 2006), from where *it*
    # thinks the stream is: on MariaDB the GTID it was started at, replaying every transaction
    # since; by file, the last event's offset, inside a transaction; and after a failover, on
    # another server, past the reconciler. The loss must reach the source instead, which
    # reopens from the checkpoint after reconciling.
    binlogstream.MYSQL_EXPECTED_ERROR_CODES.clear()
    fold_case = bool(cfg.get("fold_case"))
    kw: dict[str, Any] = {}
    if cfg["is_mariadb"] and not cfg["by_file"]:
        kw["auto_position"] = resume.gtid  # the GTID state before the transaction: all of it again
    else:
        # Inside a transaction: from its beginning (the rest of its rows event included).
        kw.update(resume_stream=True, log_file=resume.file, log_pos=resume.resume_pos)
    return checksums.reader(
        connection_settings=cfg["connection"],
        pymysql_wrapper=Connection,  # one TLS context for its two connections (see connection.py)
        server_id=cfg["server_id"],
        blocking=True,
        # The library's MariaDB dump ignores file and position: by file, use the MySQL-style dump
        # (MariaDB serves it too, and still marks its own GTID events).
        is_mariadb=cfg["is_mariadb"] and not cfg["by_file"],
        only_events=only_events,
        only_schemas=[d.lower() if fold_case else d for d in cfg["schemas"]] or None,
        filter_non_implemented_events=False,  # the decoder checks them for undecodable rows
        slave_heartbeat=HEARTBEAT_S,
        # Each event's CRC32 (binlog_checksum=CRC32, the default) is checked by the decoder; the library
        # only logs a mismatch and goes on decoding the damaged bytes.
        verify_checksum=True,
        **kw,
    )


class ChecksumsPerFile:
    """Each binlog file's events read as the file's format description says (``binlog_checksum``
    CRC32 or NONE), not as the server's setting was when the reader connected.

    The setting is the server's to change, and MariaDB and MySQL rotate to a new file when it
    changes; each file's format description carries its algorithm. The binlog library took the
    setting once, at connecting, and told the server it reads checksums only if the setting was
    CRC32: a switch to NONE while reading made the next file's events fail their checksum (the
    decoder halts on those as damaged), and a reading opened in a file written with CRC32 while
    the setting was NONE was refused by the server (``Slave can not handle replication events
    with the checksum that master is configured to log``): position lost. So the reader always
    says it reads checksums (``@master_binlog_checksum``: the server then sends every event as
    its file has it), and each format description's algorithm is taken for the events after it
    (the format description itself always ends in a checksum field).

    :meth:`reader` makes the reader class; :meth:`event` the format description class to list in
    ``only_events`` (the library builds only the classes listed; the decoder skips its events).
    """

    def __init__(self) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.constants.BINLOG import FORMAT_DESCRIPTION_EVENT
        from pymysqlreplication.event import FormatDescriptionEvent
        from pymysqlreplication.packet import BinLogPacketWrapper

        per_file = self

        class Described(FormatDescriptionEvent):  # type: ignore[misc]  # the library has no type hints
            def __init__(self, *args: Any, **kw: Any) -> None:
                super().__init__(*args, **kw)
                if per_file.current is not None and self.checksum_algorithm is not None:
                    per_file.current._BinLogStreamReader__use_checksum = self.checksum_algorithm != 0

        class Reader(BinLogStreamReader):  # type: ignore[misc]
            def __init__(self, *args: Any, **kw: Any) -> None:
                super().__init__(*args, **kw)
                per_file.current = self

            def _BinLogStreamReader__checksum_enabled(self) -> bool:
                with self._stream_connection.cursor() as cur:
                    cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
                    cur.execute("SELECT @@global.binlog_checksum")
                    (setting,) = cur.fetchone()
                return str(setting).upper() != "NONE"

        BinLogPacketWrapper._BinLogPacketWrapper__event_map[FORMAT_DESCRIPTION_EVENT] = Described
        self.current: Any = None
        self.reader: type = Reader
        self.event: type = Described


class Captured:
    """The tables a reader captures: ``tables``' patterns, matched as the binlog names tables.

    >>> c = Captured([("shop", "order*")], fold_case=True)
    >>> c.wanted("shop", "orders"), c.named("Shop", "Orders"), c.named("shop", "users")
    (True, ('shop', 'orders'), None)
    """

    def __init__(self, patterns: list[tuple[str, ...]], fold_case: bool) -> None:
        self.fold_case = fold_case
        # lower_case_table_names: names are stored, and row events carry them, in lower case
        self.patterns = [
            tuple(p.lower() for p in pattern) if fold_case else tuple(pattern) for pattern in patterns
        ]
        self._cache: dict[tuple[str, str], bool] = {}

    def wanted(self, schema: str, table: str) -> bool:
        """Whether a row event's table is captured (asked per rows event: cached)."""
        hit = self._cache.get((schema, table))
        if hit is None:
            hit = not self.patterns or any(
                fnmatch.fnmatchcase(schema, p[0]) and fnmatch.fnmatchcase(table, p[-1]) for p in self.patterns
            )
            self._cache[(schema, table)] = hit
        return hit

    def named(self, schema: str, table: str) -> tuple[str, str] | None:
        """A table as a statement names it, as row events name it, if captured: a server with
        lower_case_table_names stores (and row events carry) names in lower case, whatever case
        the statement used."""
        if self.fold_case:
            schema, table = schema.lower(), table.lower()
        return (schema, table) if self.wanted(schema, table) else None


def each_once(reader: Any) -> Iterator[Any]:
    """The reader's events, each cut from its packet once the loop is done with it.

    pymysqlreplication's event and its packet wrapper refer to each other: a cycle per binlog
    event, which only the cyclic collector frees. At 5k rows/s that was 30k objects and a pause
    of 10-17 ms every 1.5 s in this process, and the pause is on the latency path. Cut, the two
    are freed at once by reference counting."""
    for ev in reader:
        yield ev
        ev.packet = None


def drained(reader: Any) -> bool:
    """Whether everything the server has sent so far is read: then the transactions waiting here
    go on at once (low latency when caught up), while a backlog still fills frames of ``chunk``.

    A non-blocking peek at the replication connection's buffered socket (pymysql's ``_sock`` and
    ``_rfile``); anything unexpected there means "not known", and FLUSH_S decides."""
    conn = getattr(reader, "_stream_connection", None)
    sock, rfile = getattr(conn, "_sock", None), getattr(conn, "_rfile", None)
    if sock is None or rfile is None:
        return False
    timeout = sock.gettimeout()
    try:
        sock.settimeout(0.0)
        return not rfile.peek(1)
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except (OSError, ValueError):
        return False
    finally:
        sock.settimeout(timeout)
