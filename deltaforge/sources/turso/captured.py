"""A captured Turso table dropped or renamed: said, since no change event says it.

``DROP TABLE`` logs only the delete of the table's ``sqlite_schema`` row in ``turso_cdc``
(probed, pyturso 0.8.3), none for the rows it takes, so the sinks keep them; an ``ALTER TABLE``
updates that row instead. ``ALTER TABLE … RENAME`` logs nothing at all, and capture goes by
name: a table renamed out of ``tables`` has its later changes left out. The MySQL/MariaDB and
PostgreSQL sources name both (``captured_table_dropped``, ``captured_table_renamed``).
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from deltaforge.sources.turso.record import decode_record

_INTERNAL = ("sqlite_", "turso_cdc", "__turso_internal", "__deltaforge")


def name_dropped(source: str, tables: set[str] | None, schema_rows: list[tuple[Any, ...]]) -> None:
    """Log ``captured_table_dropped`` for each table of ``tables`` (None: every user table) whose
    ``sqlite_schema`` row ``schema_rows`` (``turso_cdc`` rows of one transaction) delete."""
    for change_id, _, _, change_type, _, _, before, _ in schema_rows:
        rec = decode_record(before) if change_type == -1 and before is not None else []
        if len(rec) < 2 or rec[0] != "table" or not isinstance(name := rec[1], str):
            continue
        if not name.startswith(_INTERNAL) and (tables is None or name in tables):
            structlog.get_logger().warning(
                "captured_table_dropped", actor="TursoSource", source=source, table=name, at=change_id,
                reason="its rows went without a change event for any of them: the rows already "
                "delivered stay in the sinks",
            )  # fmt: skip


class CapturedNames:
    """The names of the captured tables by their root page, which a rename keeps: looked at
    every ``every_s`` while reading (a rename logs nothing in ``turso_cdc``)."""

    every_s = 5.0

    def __init__(self, source: str, tables: set[str]) -> None:
        self.source = source
        self.tables = tables
        self.pages: dict[int, str] = {}
        self.next_look = 0.0

    def look(self, conn: Any) -> None:
        """Name each captured table renamed since the last look (blocking: in the source's thread)."""
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + self.every_s
        rows = conn.execute("SELECT name, rootpage FROM sqlite_schema WHERE type = 'table'").fetchall()
        conn.commit()
        now = {int(page): str(name) for name, page in rows if page}
        for page, name in self.pages.items():
            if (to := now.get(page)) is not None and to != name and to not in self.tables:
                structlog.get_logger().warning(
                    "captured_table_renamed", actor="TursoSource", source=self.source, table=name, to=to,
                    reason="its changes are no longer captured under a name in tables (Turso logs no rename); "
                    f"the rows already delivered stay in the sinks (add {to} to tables to go on capturing it)",
                )  # fmt: skip
        self.pages = {page: name for page, name in now.items() if name in self.tables}
