"""MySQL/MariaDB: where a binlog reader may start — the checkpoint's position checked against
the binlogs the server still has, the oldest of them, or where the binlog ends now.

Everything here runs in a worker thread (pymysql is blocking).
"""

from __future__ import annotations

from typing import Any

from deltaforge.sources.base import PositionLost, SourceMisconfigured
from deltaforge.sources.mysql.checks import ServerInfo, binlog_status
from deltaforge.sources.mysql.position import BinlogPosition, binlog_index


def check_position(conn: Any, checkpoint: BinlogPosition, info: ServerInfo, by_gtid: bool) -> None:
    """Raise :class:`PositionLost` when the checkpointed position is no longer on the server.

    ``by_gtid``: reading resumes from the checkpoint's GTID state (MariaDB), so its own file may
    be gone as long as the oldest file left starts at or before that state: nothing was written
    in between (a rotation and a purge on a quiet server)."""
    file, pos = checkpoint.file, checkpoint.pos
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        logs = {str(r[0]): int(r[1]) for r in cur.fetchall()}
        oldest = min(logs, key=binlog_index) if logs else "none"
        gone = bool(file) and file not in logs
        if gone and by_gtid and checkpoint.gtid and logs:
            cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (oldest,))
            gone = not _holds(checkpoint.gtid, str(cur.fetchone()[0] or ""))
            if not gone:
                file = ""  # served from the GTID state: the checks of the file below do not apply
    if gone:
        raise PositionLost(
            f"binlog file {file} is no longer on the server (purged; oldest available is {oldest})"
        )
    if file and pos > logs[file]:
        if binlog_index(file) == max(map(binlog_index, logs)):
            raise PositionLost(
                f"binlog position {file}:{pos} is beyond the end of the binlog (RESET MASTER?)"
            )
        # A closed binlog file shorter than a position read from it lost its end: a crash of the
        # server's machine with sync_binlog other than 1. The server went on in a new file, under
        # the lost transactions' GTIDs, so a resume by GTID would take those as read.
        raise PositionLost(
            f"binlog file {file} ends at {logs[file]}, before the checkpoint's position {pos}: the server "
            "lost the end of it (a crash of its machine with sync_binlog other than 1), and transactions "
            "written since may carry the lost ones' GTIDs"
        )
    if info.is_mariadb and checkpoint.gtid:
        current = {
            p.split("-")[0]: int(p.split("-")[2])
            for p in info.gtid_binlog_pos.split(",")
            if p.count("-") == 2
        }
        for gtid in (g.strip() for g in checkpoint.gtid.split(",") if g.count("-") == 2):
            domain, _, seq = gtid.split("-")
            if int(seq) > current.get(domain, -1):
                raise PositionLost(
                    f"GTID {gtid} is ahead of the server's binlog state {info.gtid_binlog_pos or 'empty'} "
                    "(RESET MASTER, or a different server)"
                )


def _holds(state: str, start: str) -> bool:
    """Whether the GTID state ``state`` has every transaction before ``start`` (a binlog file's
    GTID list: the state it starts at), in every replication domain ``start`` names."""
    seqs = {g.split("-")[0]: int(g.split("-")[2]) for g in state.split(",") if g.count("-") == 2}
    return all(
        seqs.get(g.split("-")[0], -1) >= int(g.split("-")[2]) for g in start.split(",") if g.count("-") == 2
    )


def earliest_position(conn: Any, info: ServerInfo) -> BinlogPosition:
    """The start of the oldest binlog still on the server, as a resume position."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [str(r[0]) for r in cur.fetchall()]
        if not files:
            raise SourceMisconfigured("the server lists no binary logs; enable log_bin")
        oldest = min(files, key=binlog_index)
        gtid = ""
        if info.is_mariadb:
            cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (oldest,))
            gtid = str(cur.fetchone()[0] or "")
    return BinlogPosition(oldest, 4, 0, gtid)


def current_position(conn: Any, info: ServerInfo) -> BinlogPosition:
    """Where the binlog ends now, as a resume position (a snapshot copies what came before)."""
    with conn.cursor() as cur:
        found = binlog_status(cur)
        if found is None:
            raise SourceMisconfigured("the server's binlog status is empty; enable log_bin")
        gtid = ""
        if info.is_mariadb:
            cur.execute("SELECT @@gtid_binlog_pos")
            gtid = str(cur.fetchone()[0] or "")
    return BinlogPosition(str(found[0]), int(found[1]), 0, gtid)
