"""A captured Turso table dropped: said, since its rows go without a change event.

``DROP TABLE`` logs only the delete of the table's ``sqlite_schema`` row in ``turso_cdc``
(probed, pyturso 0.8.3), none for the rows it takes, so the sinks keep them; an ``ALTER TABLE``
updates that row instead, and a rename logs nothing at all. The MySQL/MariaDB and PostgreSQL
sources name a dropped table the same way (``captured_table_dropped``).
"""

from __future__ import annotations

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
