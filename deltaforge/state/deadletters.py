"""Where dead letters are kept: beside the checkpoints, in the same store.

An entry is a JSON document (see ``pipeline/dlq.py`` for what it holds) with a
``seq`` the store assigns, increasing, never reused. Entries are selected by
pipeline and optionally sink, error kind, seq (a list, or everything up to one)
and age; the policy (bounds, overflow) is the pipeline's, not the store's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from deltaforge.state.sqlitewrites import SerialWrites

Entry = dict[str, Any]

SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letters (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL, sink TEXT NOT NULL, kind TEXT NOT NULL,
    at REAL NOT NULL, doc BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS dead_letters_by_pipeline ON dead_letters (pipeline, seq);
"""


@dataclass(frozen=True, slots=True)
class Select:
    """Which entries of a pipeline: all of them unless narrowed."""

    sink: str | None = None
    kind: str | None = None
    seqs: tuple[int, ...] | None = None
    up_to: int | None = None
    older_than: float | None = None
    limit: int | None = None

    def matches(self, e: Entry) -> bool:
        return (
            (self.sink is None or e["sink"] == self.sink)
            and (self.kind is None or e["kind"] == self.kind)
            and (self.seqs is None or e["seq"] in self.seqs)
            and (self.up_to is None or e["seq"] <= self.up_to)
            and (self.older_than is None or e["at"] < self.older_than)
        )


class DeadLetterStore(ABC):
    """Dead letters of every pipeline using this store, oldest first."""

    @abstractmethod
    async def add(self, entry: Entry) -> int:
        """Keep ``entry`` (with ``pipeline``, ``sink``, ``kind``, ``at``); its new seq."""

    @abstractmethod
    async def select(self, pipeline: str, which: Select = Select()) -> list[Entry]:
        """Matching entries, oldest first, each with its ``seq``."""

    @abstractmethod
    async def count(self, pipeline: str, sink: str | None = None) -> int:
        """How many entries."""

    @abstractmethod
    async def delete(self, pipeline: str, seqs: list[int]) -> int:
        """Remove these entries; how many were there."""


class MemoryDeadLetters(DeadLetterStore):
    """A list (the memory and file stores; the file store writes ``entries`` out itself)."""

    def __init__(self, persist: Callable[[], Awaitable[None]] | None = None) -> None:
        self.entries: list[Entry] = []
        self.next_seq = 1
        self._persist = persist

    async def add(self, entry: Entry) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        kept = {**entry, "seq": seq}
        self.entries.append(kept)
        try:
            await self._saved()
        except BaseException:
            # Not kept (the file store could not write it): a retry must not keep it twice.
            self.entries = [e for e in self.entries if e is not kept]
            raise
        return seq

    async def select(self, pipeline: str, which: Select = Select()) -> list[Entry]:
        found = [e for e in self.entries if e["pipeline"] == pipeline and which.matches(e)]
        return found[: which.limit] if which.limit is not None else found

    async def count(self, pipeline: str, sink: str | None = None) -> int:
        return len(await self.select(pipeline, Select(sink=sink)))

    async def delete(self, pipeline: str, seqs: list[int]) -> int:
        gone = set(seqs)
        before = len(self.entries)
        self.entries = [e for e in self.entries if not (e["pipeline"] == pipeline and e["seq"] in gone)]
        await self._saved()
        return before - len(self.entries)

    async def _saved(self) -> None:
        if self._persist is not None:
            await self._persist()


class SqliteDeadLetters(DeadLetterStore):
    """A table in the checkpoint store's SQLite file, written with its durability."""

    def __init__(self, writes: SerialWrites) -> None:
        self._writes = writes

    async def add(self, entry: Entry) -> int:
        async with self._writes.transaction() as db:
            cur = await db.execute(
                "INSERT INTO dead_letters(pipeline, sink, kind, at, doc) VALUES (?, ?, ?, ?, ?)",
                (entry["pipeline"], entry["sink"], entry["kind"], entry["at"], orjson.dumps(entry)),
            )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    async def select(self, pipeline: str, which: Select = Select()) -> list[Entry]:
        sql, args = "SELECT seq, doc FROM dead_letters WHERE pipeline = ?", list[Any]([pipeline])
        for column, op, value in (("sink", "=", which.sink), ("kind", "=", which.kind),
                                  ("seq", "<=", which.up_to), ("at", "<", which.older_than)):  # fmt: skip
            if value is not None:
                sql += f" AND {column} {op} ?"
                args.append(value)
        if which.seqs is not None:
            sql += f" AND seq IN ({','.join('?' * len(which.seqs))})"
            args.extend(which.seqs)
        sql += " ORDER BY seq"
        if which.limit is not None:
            sql += f" LIMIT {int(which.limit)}"
        async with self._writes.db.execute(sql, args) as cur:
            return [{**orjson.loads(doc), "seq": seq} for seq, doc in await cur.fetchall()]

    async def count(self, pipeline: str, sink: str | None = None) -> int:
        sql, args = "SELECT COUNT(*) FROM dead_letters WHERE pipeline = ?", [pipeline]
        if sink is not None:
            sql += " AND sink = ?"
            args.append(sink)
        async with self._writes.db.execute(sql, args) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def delete(self, pipeline: str, seqs: list[int]) -> int:
        if not seqs:
            return 0
        async with self._writes.transaction() as db:
            cur = await db.execute(
                f"DELETE FROM dead_letters WHERE pipeline = ? AND seq IN ({','.join('?' * len(seqs))})",
                [pipeline, *seqs],
            )
        return int(cur.rowcount)
