"""MySQL/MariaDB failover: the server's identity, and whether a checkpoint's GTID position is
on it (see ``deltaforge/pipeline/reconciler.py``).

Identity: MySQL ``@@server_uuid``; MariaDB (no server UUID) ``@@server_id`` and
``@@gtid_domain_id``. Reachability: every domain of the checkpoint's GTID position is within
the server's binlog state (not ahead: RESET MASTER, a lagging replica) and not before the
oldest binlog still on it (purged).

MariaDB on *another* server, reachable: the source resumes by the GTID position in a new
failover generation (``BinlogPosition.gen``), since binlog file and offset differ between
servers. MySQL on another server is refused: resuming there needs a GTID resume, which this
source does not do for MySQL yet; re-snapshot from the new server.
"""

from __future__ import annotations

from typing import Any

from deltaforge.sources.base import PositionLost, SourceMisconfigured
from deltaforge.sources.mysql.position import BinlogPosition, binlog_index


def identity(conn: Any) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        if mariadb:
            cur.execute("SELECT @@server_id, @@gtid_domain_id")
            server_id, domain = cur.fetchone()
            return {"flavor": "mariadb", "server_id": str(server_id), "gtid_domain_id": str(domain)}
        cur.execute("SELECT @@server_uuid")
        return {"flavor": "mysql", "server_uuid": str(cur.fetchone()[0])}


def _domains(gtids: str) -> dict[str, tuple[int, str]]:
    """``0-1-50,1-1-3`` as {domain: (seq, gtid)}."""
    out: dict[str, tuple[int, str]] = {}
    for gtid in (g.strip() for g in gtids.split(",")):
        if gtid.count("-") == 2:
            domain, _, seq = gtid.split("-")
            out[domain] = (int(seq), gtid)
    return out


def check_reachable(conn: Any, checkpoint: BinlogPosition, previous: dict[str, str] | None) -> None:
    """Raise PositionLost unless the checkpoint's GTID position is on this server (see the
    module). On the same server, opening the source checks purged binlogs by file name, which
    says more."""
    if previous is not None and previous.get("flavor") != "mariadb":
        raise SourceMisconfigured(
            "failover detected: the DSN now leads to another MySQL server; resuming there is not "
            "supported yet (binlog coordinates differ between servers). Re-snapshot from the new server."
        )
    if not checkpoint.gtid:
        if previous is not None:
            raise SourceMisconfigured(
                "failover detected: the checkpoint has no GTID position to resume from on another server. "
                "Re-snapshot from the new server."
            )
        return  # file/position only: checked when the source opens
    with conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        state_text = str(cur.fetchone()[0] or "")
        cur.execute("SHOW BINARY LOGS")
        files = [str(r[0]) for r in cur.fetchall()]
        oldest: dict[str, tuple[int, str]] = {}
        if files and previous is not None:
            cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (min(files, key=binlog_index),))
            oldest = _domains(str(cur.fetchone()[0] or ""))
    state = _domains(state_text)
    for domain, (seq, gtid) in _domains(checkpoint.gtid).items():
        if seq > state.get(domain, (-1, ""))[0]:
            raise PositionLost(
                f"GTID {gtid} of the checkpoint is not in this server's binlog state {state_text or 'empty'} "
                "(a lagging replica, or RESET MASTER)"
            )
        if seq < oldest.get(domain, (0, ""))[0]:
            raise PositionLost(f"the binlogs holding the GTIDs after {gtid} were purged from this server")
