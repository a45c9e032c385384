"""One DBLog window: chunks selected between a low and a high watermark."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deltaforge.events import Event, Row

WATERMARK_PREFIX = "deltaforge.snapshot"
"""The prefix of PostgreSQL watermark messages, and the ``type`` of MySQL watermark rows is
``snapshot-window-open`` / ``snapshot-window-close`` (Debezium's names)."""

Key = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class TableRef:
    """A table a snapshot reads: its name as users write it (``db.table`` or ``schema.table``)
    and its primary-key columns, in index order (chunks are key ranges)."""

    name: str
    key: tuple[str, ...]


def key_of(row: Row, columns: tuple[str, ...]) -> Key:
    return tuple(row.get(c) for c in columns)


@dataclass(slots=True)
class Chunk:
    """The rows of one key range of a table, as selected; ``last`` is the range's last key as
    read (the next chunk starts after it, whatever the window removes)."""

    table: TableRef
    rows: list[Row]
    last: list[Any] | None
    """The last key read, as stored in the progress (the next chunk starts after it)."""
    full: bool
    """More rows followed the chunk when it was read: the table is not done."""
    stale: set[Key] = field(default_factory=set)
    """Keys changed inside the window (rows are keyed only when a change asks: most windows see
    none of their chunk's keys change)."""


@dataclass(slots=True)
class Window:
    """Chunks read between the watermarks ``open:{id}`` and ``close:{id}``.

    While the stream is between the two (``opened``), a change to a key of a chunk removes that
    row: the change is at least as new as what the select saw, and it is delivered itself.

        >>> t = TableRef("shop.items", ("id",))
        >>> w = Window("w1", {t.name: Chunk(t, [{"id": 1}, {"id": 2}], [2], False)})
        >>> w.opened = True
        >>> w.saw("shop.items", ({"id": 1},))
        >>> [rows for _, rows in w.survivors()]
        [[{'id': 2}]]
    """

    id: str
    chunks: dict[str, Chunk]
    opened: bool = False
    removed: int = field(default=0)
    read_at: float = 0.0
    """When its chunks were read (monotonic): the wait for its high watermark is logged."""

    def saw(self, table: str, images: tuple[Row | None, ...]) -> None:
        """A change read inside the window, with its row images (before and after: an update of a
        primary key removes both keys)."""
        chunk = self.chunks.get(table)
        if chunk is None or not self.opened:
            return
        for image in images:
            if image is not None:
                chunk.stale.add(key_of(image, chunk.table.key))

    def truncated(self, table: str) -> None:
        """A TRUNCATE inside the window: nothing selected from that table may be emitted."""
        chunk = self.chunks.get(table)
        if chunk is not None and self.opened:
            self.removed += len(chunk.rows)
            chunk.rows = []

    def survivors(self) -> list[tuple[TableRef, list[Row]]]:
        """The rows left, table by table in key order (as selected)."""
        out = []
        for c in self.chunks.values():
            rows = c.rows
            if c.stale:
                key, stale = c.table.key, c.stale
                rows = [r for r in rows if key_of(r, key) not in stale]
                self.removed += len(c.rows) - len(rows)
            out.append((c.table, rows))
        return out


def watch(window: Window, name: str, e: Event) -> None:
    """Apply one change event read while ``window`` is pending."""
    if e.op == "t":
        window.truncated(name)
    elif e.op in ("c", "u", "d", "r"):
        window.saw(name, (e.before, e.after))
