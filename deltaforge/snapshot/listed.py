"""Tables added to a source's ``tables`` since its last start.

The stream carries a table's changes from the moment it is captured; the rows it already had
reach no sink that way. A pipeline whose snapshot ``mode`` copies rows (``initial``,
``when_needed``, ``always``) copies them, as it did for the tables listed at its first start;
with ``never`` it says which tables and how to copy them, instead of leaving them out in silence.
The list as last started is kept in the checkpoint store (``<source>::tables``).
"""

from __future__ import annotations

from typing import Any

from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.state.checkpoints import CheckpointStore

WILDCARDS = "*?["


def listed_key(source_id: str) -> str:
    return f"{source_id}::tables"


class ListedTables:
    """The source's ``tables`` as configured now, against the list its last start stored."""

    def __init__(
        self, store: CheckpointStore, source_id: str, listed: list[str] | None, writes: PatientWrites
    ):
        self.store, self.key, self.writes = store, listed_key(source_id), writes
        self.listed = list(listed or [])  # empty: every table, nothing to compare
        self.checked = False
        """The list as it is now is stored: this process need not look again."""

    async def added(self) -> list[str]:
        """The names listed now that the last start did not list ([] at a first start, and for
        a source whose start stored no list: the tables were all captured then)."""
        if not self.listed:
            return []
        stored = await self.store.get(self.key)
        before = stored.get("tables") if stored is not None else None
        if not isinstance(before, list) or not before:  # none stored, or every table then
            return []
        return [t for t in self.listed if t not in before]

    async def remember(self) -> None:
        """Store the list as it is now (once the added tables' snapshot is requested)."""
        doc: dict[str, Any] = {"tables": self.listed}
        if await self.store.get(self.key) != doc:
            await self.writes(lambda: self.store.put(self.key, doc))
        self.checked = True


def copyable(names: list[str], wanted: list[str] | None) -> tuple[list[str], list[str]]:
    """``names`` split into those a snapshot copies by name (``wanted``: the snapshot's own
    ``tables``, None for all) and the rest (patterns; tables the snapshot leaves out)."""
    copy = [n for n in names if not any(ch in n for ch in WILDCARDS) and (wanted is None or n in wanted)]
    return copy, [n for n in names if n not in copy]
