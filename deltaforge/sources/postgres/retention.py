"""How much WAL the replication slot keeps on the server's disk, said as it grows.

The slot is moved only to the position every sink holds durably (``replication.py``), so a sink
behind keeps the server's WAL from there on: an optional sink lagging (which the other sinks never
wait for), a required one down or slow. On the database server's disk that WAL grows without
bound unless ``max_slot_wal_keep_size`` is set (it is not by default), and past that setting the
server removes WAL the slot still needs at its next checkpoint: the pipeline then halts with
``position lost``. Either is worth knowing before it happens, so the publication check (every
5 s) also reads the slot's ``pg_replication_slots`` row:

* ``slot_wal_retained`` (warning) once the slot keeps ``wal_warn_mb``, and again at each doubling
  (``warn_mb`` is the threshold passed); ``slot_wal_released`` once it is back under it;
* ``slot_wal_at_risk`` (error) when its ``wal_status`` turns ``unreserved``: past
  ``max_slot_wal_keep_size``;
* the bytes, for ``deltaforge_source_retained_bytes``.
"""

from __future__ import annotations

import asyncpg
import structlog

_SLOT = (
    "SELECT {}, ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
    "ELSE pg_current_wal_flush_lsn() END) - restart_lsn)::bigint, {} "
    "FROM pg_replication_slots WHERE slot_name = $1"
)
_SLOT_13 = _SLOT.format("wal_status", "safe_wal_size")
_SLOT_12 = _SLOT.format("NULL", "NULL")
"""Before PostgreSQL 13, no ``wal_status`` (nor ``max_slot_wal_keep_size``): the bytes alone."""

_HELD = (
    "the slot keeps the WAL from the position every sink holds durably: a sink behind (an optional "
    "sink lagging, a required one down) keeps it on the database server's disk until it catches up"
)


class SlotRetention:
    """The WAL one slot keeps (see the module)."""

    def __init__(self, source: str, slot: str, warn_bytes: int) -> None:
        self.source = source
        self.slot = slot
        self.warn_bytes = warn_bytes
        self.retained: int | None = None
        """The bytes the slot kept at the last look (None: not looked at yet)."""
        self._said = 0  # the threshold last warned at (0: under the first)
        self._at_risk = False

    async def check(self, conn: asyncpg.Connection) -> None:
        """Read the slot's row and say what changed since the last look."""
        row = await conn.fetchrow(_SLOT_13 if conn.get_server_version().major >= 13 else _SLOT_12, self.slot)
        if row is None:  # dropped: the stream halts as position lost
            return
        status, retained, safe = row[0], int(row[1] or 0), row[2]
        self.retained = retained
        log = structlog.get_logger()
        level = self._threshold(retained)
        if level > self._said:
            log.warning(
                "slot_wal_retained", actor="PostgresSource", source=self.source, slot=self.slot,
                retained_mb=retained >> 20, warn_mb=level >> 20, wal_status=status,
                reason=_HELD + "; nothing bounds it unless max_slot_wal_keep_size is set "
                "(GET /pipelines/<name> says which sinks lag)",
            )  # fmt: skip
        elif level == 0 and self._said:
            log.info("slot_wal_released", actor="PostgresSource", source=self.source, slot=self.slot,
                     retained_mb=retained >> 20)  # fmt: skip
        self._said = level
        at_risk = status == "unreserved"
        if at_risk and not self._at_risk:
            log.error(
                "slot_wal_at_risk", actor="PostgresSource", source=self.source, slot=self.slot,
                retained_mb=retained >> 20, safe_wal_mb=None if safe is None else int(safe) >> 20,
                reason=_HELD + "; it is past max_slot_wal_keep_size, so the server removes WAL the slot "
                "needs at its next checkpoint, and the pipeline then halts with position lost",
            )  # fmt: skip
        self._at_risk = at_risk

    def _threshold(self, retained: int) -> int:
        """The largest of ``warn_bytes`` times 2^k that ``retained`` reaches (0: none)."""
        if retained < self.warn_bytes:
            return 0
        return self.warn_bytes << ((retained // self.warn_bytes).bit_length() - 1)
