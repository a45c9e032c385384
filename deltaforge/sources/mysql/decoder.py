"""The binlog decoder process: python-mysql-replication outside the service's GIL
(see ``childproc.py`` for why and how). Frames it writes:

* ``("txs", [(gtid, state, file, end_pos, start_pos, [(op, schema, table, pos, row, ts, before, after), ...]), ...])``
  where ``state`` is the GTID position after the transaction (MariaDB: every domain's last GTID)
* ``("ahead", more)``: when it changes, before the ``txs`` frame it is about (if any): whether
  the server had already sent more when it was written (``childframes.AHEAD``)
* ``("schema", table, columns, position, key)``: ``key`` the primary-key columns in the key's order
* ``("partial", table, "file:pos", columns)``: the first rows event of ``table`` with a partial
  row image this run (its left-out values are marked, see ``rowvalues.fill_not_logged``)
* ``("moved", table, new_name_or_None, "file:pos")``: a captured table renamed out of ``tables``,
  or dropped
* ``("moved_in", table, old_name, "file:pos")``: a table renamed into ``tables``, with its rows
* ``("repartitioned", table, what, "file:pos")``: a captured table's rows changed by partition
  maintenance (``DROP PARTITION``, ...), which writes no row events
* ``("error", kind, message)`` with kind ``position_lost`` or ``source``, then exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, Any

from deltaforge.sources.childframes import Ahead, write_frame
from deltaforge.sources.childside import child_setup, log_crash
from deltaforge.sources.mysql.binlog import (
    Captured,
    ChecksumsPerFile,
    DecoderSettings,
    drained,
    each_once,
    open_reader,
)
from deltaforge.sources.mysql.halts import PARTIAL_JSON, UNDECODABLE, CorruptEvent, Undecodable, XaUnknown
from deltaforge.sources.mysql.position import BinlogPosition
from deltaforge.sources.mysql.rowvalues import fill_not_logged
from deltaforge.sources.mysql.statements import (
    Unreadable,
    moved,
    repartitioned,
    rows_of_statement,
    session_db,
)
from deltaforge.sources.mysql.tableshapes import TableShapes
from deltaforge.sources.mysql.txevents import frame_sender
from deltaforge.sources.mysql.xa import PreparedXa, xa_key

FLUSH_S = 0.01  # through a backlog, hand over at least this often (caught up: at once, see drained)
IDLE_MARK_S = 1.0  # while only uncaptured tables change, a transaction end becomes a heartbeat this often
_STANDALONE = 0x01  # MariaDB GTID flag: a statement with no COMMIT/XID after it
_XA = 0x40 | 0x80  # MariaDB GTID flags FL_PREPARED_XA, FL_COMPLETED_XA: an XA transaction's group
_SAME_ID = "same server_uuid/server_id"
"""In the error a server sends a replica whose server id another replica connected with."""
_LOST_CODES = {1236}  # ER_MASTER_FATAL_ERROR_READING_BINLOG: purged, or GTID not in the binlog


def _advance(domains: dict[str, str], gtid: str, is_mariadb: bool) -> str:
    """The GTID position once ``gtid`` is committed (MariaDB: every domain's last GTID)."""
    if is_mariadb and gtid:
        domains[gtid.split("-", 1)[0]] = gtid
        return ",".join(domains[d] for d in sorted(domains, key=int))
    return gtid


def gtid_domains(state: str) -> dict[str, str]:
    """``"0-1-5,1-1-9"`` -> ``{"0": "0-1-5", "1": "1-1-9"}`` (MariaDB GTID positions)."""
    return {g.split("-", 1)[0]: g for g in (p.strip() for p in state.split(",")) if g.count("-") == 2}


def stream(cfg: DecoderSettings, out: IO[bytes]) -> None:
    from pymysqlreplication.event import (
        GtidEvent,
        HeartbeatLogEvent,
        MariadbGtidEvent,
        NotImplementedEvent,
        QueryEvent,
        RotateEvent,
        XAPrepareEvent,
        XidEvent,
    )
    from pymysqlreplication.row_event import (
        DeleteRowsEvent,
        PartialUpdateRowsEvent,
        TableMapEvent,
        UpdateRowsEvent,
        WriteRowsEvent,
    )

    from deltaforge.sources.mysql.charsets import install as install_charsets
    from deltaforge.sources.mysql.rowimages import RowImages
    from deltaforge.sources.mysql.rowimages import install as install_dates
    from deltaforge.sources.mysql.tablemaps import install as install_table_maps

    install_charsets()
    install_dates()

    rows_types = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)  # a PartialUpdateRowsEvent is one
    op_of = {WriteRowsEvent: "c", UpdateRowsEvent: "u", DeleteRowsEvent: "d"}
    images = RowImages()
    captured = Captured(cfg["patterns"], bool(cfg.get("fold_case")))
    wanted, named, patterns = captured.wanted, captured.named, captured.patterns
    resume = BinlogPosition.from_doc(cfg["resume"])
    keys: dict[str, tuple[str, ...]] = {}  # what the schema frames said, as serve's pump keeps it
    send = frame_sender(cfg.get("envelopes"), resume.gtid, out, keys)
    checksums = ChecksumsPerFile()
    reader = open_reader(
        cfg,
        resume,
        [
            *rows_types,
            PartialUpdateRowsEvent,  # never decoded: halts below (left out, it was skipped)
            XidEvent,
            QueryEvent,
            RotateEvent,
            MariadbGtidEvent,
            GtidEvent,
            HeartbeatLogEvent,
            NotImplementedEvent,
            XAPrepareEvent,
            # its column types decode the rows after it: its checksum counts too
            install_table_maps(),
            checksums.event,  # says whether the file's events end in a checksum (skipped below)
        ],
        checksums,
    )
    skipped = (TableMapEvent, checksums.event)  # read by the library for the events after them
    file = resume.file
    tx_start = resume.resume_pos  # where the transaction being read began in ``file``
    tx_gtid = resume.gtid
    # MariaDB: the last GTID of every replication domain. A position names them all, so a resume
    # continues each domain where it was (one GTID alone re-reads the other domains from their start).
    domains = gtid_domains(resume.gtid) if cfg["is_mariadb"] else {}
    full = resume.gtid
    xa = PreparedXa()
    xa_current: str | None = None
    shapes = TableShapes(bool(cfg["is_mariadb"]))
    partial: set[str] = set()  # tables a partial row image was met in (said once each)
    tx: list[tuple[Any, ...]] = []
    standalone = False
    # A plain transaction (its own GTID, then BEGIN; not XA, whose rows wait for XA COMMIT) larger
    # than a chunk is handed over in pieces as it is read, not held whole until its XID: the
    # binlog holds only committed transactions, so a piece is final (see the source's _events).
    piecewise = own_gtid = False
    pending: list[tuple[Any, ...]] = []
    pending_rows = 0
    last_mark = time.monotonic()
    since = time.monotonic()
    chunk = int(cfg["chunk"])
    said = Ahead(out)

    def halting(exc: Exception) -> Exception:
        """``exc``, after the whole transactions read before it: they are delivered and
        checkpointed, so the halt stops right at the event that caused it."""
        if pending:
            send(pending)
        return exc

    for ev in each_once(reader):
        if ev._is_event_valid is False:
            raise halting(
                CorruptEvent(
                    f"the binlog event at {file}:{ev.packet.log_pos} (type {ev.event_type}) does not match its "
                    "CRC32 checksum: damaged on the server's disk or in transit; its rows are not delivered"
                )
            )
        if isinstance(ev, skipped):
            continue
        if isinstance(ev, HeartbeatLogEvent):
            said.say(False)  # the server had nothing more to send
            if pending:
                send(pending)
                pending, pending_rows = [], 0
            continue
        if isinstance(ev, RotateEvent):
            file = ev.next_binlog
            tx_start = int(ev.position)
            continue
        if isinstance(ev, NotImplementedEvent):
            what = UNDECODABLE.get(ev.event_type)
            if what is not None:
                raise halting(
                    Undecodable(
                        f"{what} (type {ev.event_type}) at {file}:{ev.packet.log_pos} cannot be decoded and may "
                        "hold rows; set log_bin_compress=OFF (MariaDB) or binlog_transaction_compression=OFF "
                        "(MySQL) and re-snapshot from a position after it"
                    )
                )
            continue
        if isinstance(ev, MariadbGtidEvent | GtidEvent):
            tx_gtid = ev.gtid
            standalone = isinstance(ev, MariadbGtidEvent) and bool(ev.flags & _STANDALONE)
            # MariaDB's GTID event stands for BEGIN (none is logged); MySQL logs BEGIN after it.
            plain = isinstance(ev, MariadbGtidEvent) and not ev.flags & (_STANDALONE | _XA)
            tx, piecewise, own_gtid = [], plain, True
            continue
        if isinstance(ev, rows_types):
            if not wanted(ev.schema, ev.table):
                continue
            op = op_of.get(type(ev))
            if op is None:  # a PartialUpdateRowsEvent (the only row event type not in op_of)
                raise halting(
                    Undecodable(
                        f"{PARTIAL_JSON} at {file}:{ev.packet.log_pos} on {ev.schema}.{ev.table}; set "
                        "binlog_row_value_options='' and re-snapshot the table from a position after it"
                    )
                )
            table = f"{ev.schema}.{ev.table}"
            pos = int(ev.packet.log_pos)
            try:
                frame = shapes.schema_frame(ev, table, file, pos, tx_gtid)
            except Undecodable as exc:
                raise halting(exc) from None
            if frame is not None:
                if pending:  # read before this schema: serve makes their events with the keys before it
                    send(pending)
                    pending, pending_rows = [], 0
                keys[table] = frame[-1]
                write_frame(out, frame)
            ts = int(ev.timestamp)
            rows = images.rows_of(ev, 2 if op == "u" else 1)
            absent = fill_not_logged(ev, op)
            if absent and table not in partial:
                partial.add(table)
                write_frame(out, ("partial", table, f"{file}:{pos}", absent))
            shapes.fix(table, rows)
            for i, row in enumerate(rows):
                if op == "u":
                    tx.append(
                        (op, ev.schema, ev.table, pos, i, ts, row["before_values"], row["after_values"])
                    )
                elif op == "c":
                    tx.append((op, ev.schema, ev.table, pos, i, ts, None, row["values"]))
                else:
                    tx.append((op, ev.schema, ev.table, pos, i, ts, row["values"], None))
            if piecewise and len(tx) > chunk:
                # all but the last row: the piece that ends the transaction carries it, and its end
                pending.append((tx_gtid, None, file, None, tx_start, tx[:-1]))
                tx = tx[-1:]
                send(pending)
                pending, pending_rows = [], 0
            continue
        if isinstance(ev, XAPrepareEvent):  # the rows wait for XA COMMIT
            if xa_current is not None:  # even with no captured rows: its XA COMMIT will look for it
                xa.prepared(xa_current, tx, full)
            tx, xa_current = [], None
            full = _advance(domains, tx_gtid, cfg["is_mariadb"])
            tx_start = int(ev.packet.log_pos)
            continue
        if isinstance(ev, QueryEvent):
            if (key := xa_key(ev.query, "END")) is not None:
                xa_current = key
                continue
            if ev.query.lstrip().upper().startswith("XA "):
                piecewise = False  # XA START (its GTID's flags said so already, on MariaDB)
            if (key := xa_key(ev.query, "COMMIT")) is not None:
                held = xa.committed(key, int(ev.packet.log_pos))
                if held is None:
                    raise halting(
                        XaUnknown(
                            f"XA COMMIT {key} at {file}:{ev.packet.log_pos}: its XA PREPARE is before the "
                            "position this reader started from, so its rows cannot be read"
                        )
                    )
                tx, standalone = held, True  # XA COMMIT ends its own group
            elif (key := xa_key(ev.query, "ROLLBACK")) is not None:
                xa.rolled_back(key)
                standalone = True
            elif ev.query == "BEGIN":
                piecewise = own_gtid and not tx and not standalone
            else:
                for frame in _ddl_frames(ev.query, session_db(ev), named, f"{file}:{ev.packet.log_pos}"):
                    write_frame(out, frame)  # DDL: said, not delivered
                try:
                    standalone = rows_of_statement(ev, tx, named, patterns) or standalone
                except Unreadable as exc:
                    raise halting(Undecodable(f"{exc} at {file}:{ev.packet.log_pos} {exc.why}")) from None
        end = isinstance(ev, XidEvent) or (
            isinstance(ev, QueryEvent) and (standalone or ev.query.strip().upper() == "COMMIT")
        )
        if not end:
            continue
        full = _advance(domains, tx_gtid, cfg["is_mariadb"])
        if (held_state := xa.held_state()) is not None:
            full = held_state  # a restart must read the open XA PREPARE again
        began, tx_start = tx_start, int(ev.packet.log_pos)
        own_gtid = piecewise = False
        now = time.monotonic()
        # Nothing captured in this transaction? Now and then its end is handed over anyway (no
        # rows: a heartbeat), so checkpoints move while the captured tables are idle; otherwise
        # they would stay in an old binlog until it expires.
        if not tx and now - last_mark < IDLE_MARK_S:
            if said.more and drained(reader):
                said.say(False)  # said before this transaction of other tables, which ended it all
            continue
        last_mark = now
        if not pending:
            since = now
        pending.append((tx_gtid, full, file, int(ev.packet.log_pos), began, tx))
        pending_rows += len(tx)
        tx = []
        quiet = drained(reader)
        if quiet or pending_rows >= chunk or time.monotonic() - since >= FLUSH_S:
            # Whether the server has sent more already goes before the frame: the reader is
            # caught up only when it has not, so a backlog's batches fill to max_events instead
            # of one a frame (docs/performance.md).
            said.say(not quiet)
            send(pending)
            pending, pending_rows = [], 0


def _ddl_frames(
    query: str, db: str, named: Callable[[str, str], tuple[str, str] | None], where: str
) -> list[tuple[Any, ...]]:
    """What a DDL statement does to captured tables that no change event says: a table moved out
    of ``tables`` (renamed or dropped) or into it (renamed: its rows came with no change), rows
    changed by partition maintenance."""
    frames: list[tuple[Any, ...]] = []
    for taken, into in moved(query, db):
        gone, came = named(*taken), (named(*into) if into is not None else None)
        if gone is not None and came is None:
            frames.append(("moved", ".".join(gone), into and ".".join(into), where))
        elif gone is None and came is not None:
            frames.append(("moved_in", ".".join(came), ".".join(taken), where))
    for table, what in repartitioned(query, db):
        if (hit := named(*table)) is not None:
            frames.append(("repartitioned", ".".join(hit), what, where))
    return frames


def main() -> None:
    cfg, out = child_setup(warm=("pymysqlreplication", "pymysqlreplication.row_event"))
    try:
        stream(cfg, out)
    except BrokenPipeError:
        return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        import pymysql

        from deltaforge.sources.mysql.checks import is_unavailable

        code = exc.args[0] if isinstance(exc, pymysql.err.OperationalError) and exc.args else None
        detail = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, Undecodable):
            kind = "misconfigured"
        elif _SAME_ID in str(exc):  # MariaDB 4052; MySQL says it with 1236, its code for a lost position
            kind = "misconfigured"
            detail = (
                f"another replica connected to the server with this source's server id {cfg['server_id']}, "
                f"so the server refused this one ({exc.args[-1]}): two replicas of one id drop each other, "
                "endlessly. Set spec.source.config.server_id to an id no other replica of this server uses "
                "(unset, it is derived from the machine, the checkpoint store, the pipeline and the source id)"
            )
        elif code in _LOST_CODES:
            kind, detail = "position_lost", str(exc.args[-1])
        elif isinstance(exc, XaUnknown):
            kind, detail = "position_lost", str(exc)
        else:
            kind = "unavailable" if is_unavailable(exc) else "source"
        if kind == "source" and not isinstance(exc, CorruptEvent):  # its message says it all
            log_crash(exc)
        try:
            write_frame(out, ("error", kind, str(detail)))
        except BrokenPipeError:
            pass


if __name__ == "__main__":
    main()
