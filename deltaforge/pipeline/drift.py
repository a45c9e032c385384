"""Schema drift after a failover: the new server's tables against the schemas last recorded.

The schema history (``CheckpointStore.record_schema``) holds, per captured table,
the columns the source decoded rows with. After a failover the FailoverReconciler
compares the latest version of each with the new server's live catalog
(``Source.describe_tables``): columns added, removed, or of another declared type.
A rename shows as one removed and one added.

Types are compared only where both sides declare them as SQL text (a binlog
decoder records numeric field codes, which say nothing comparable).
"""

from __future__ import annotations

from typing import Any

from deltaforge.sources.base import DeclaredTable, Source
from deltaforge.state.checkpoints import CheckpointStore

Drift = dict[str, dict[str, list[str]]]
"""``{"db.table": {"added": [...], "removed": [...], "changed": [...], "missing": [...]}}``"""

HALT_MESSAGE = (
    "schema drift detected after failover and on_schema_drift=halt. "
    "Verify the new server's schema and apply any missing migrations before restarting."
)


async def schema_drift(store: CheckpointStore, source: Source) -> Drift:
    """How the live tables differ from the last recorded schemas (empty: none, or nothing recorded)."""
    tables = await store.schema_tables(source.id)
    if not tables:
        return {}
    live = {f"{t.db}.{t.table}": t for t in await source.describe_tables()}
    drift: Drift = {}
    for table in tables:
        history = await store.schema_history(source.id, table)
        found = _compare(history[-1]["columns"], live.get(table))
        if found:
            drift[table] = found
    return drift


def _compare(recorded: list[dict[str, Any]], live: DeclaredTable | None) -> dict[str, list[str]]:
    if live is None:
        return {"missing": ["table"]}
    was = {str(c["name"]): c.get("type") for c in recorded}
    now = dict(live.columns)
    out: dict[str, list[str]] = {}
    added = [c for c in now if c not in was]
    removed = [c for c in was if c not in now]
    changed = [
        f"{c}: {typ} -> {now[c]}"
        for c, typ in was.items()
        if c in now and isinstance(typ, str) and typ.lower() != now[c].lower()
    ]
    for kind, names in (("added", added), ("removed", removed), ("changed", changed)):
        if names:
            out[kind] = names
    return out


def describe(drift: Drift) -> str:
    """``shop.items: added note; shop.orders: removed qty``."""
    return "; ".join(
        f"{table}: " + ", ".join(f"{kind} {' '.join(names)}" for kind, names in kinds.items())
        for table, kinds in sorted(drift.items())
    )
