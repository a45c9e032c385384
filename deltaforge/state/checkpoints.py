"""Checkpoint stores: what every store does, and the JSON file and memory ones (SQLite, the
default: ``sqlite_store.py``).

A store keeps positions in their stored form (:data:`~deltaforge.position.PositionDoc`,
a small JSON mapping): it serves every source and the CLI alike, so it does not know
position types; the pipeline turns them into its source's type on load.

All three keep a version history per key so an operator can list versions and
roll back. Writes of several keys (one per sink) are atomic in every store: a
crash leaves either all of a batch's checkpoints or none of them.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from actors import in_thread
from deltaforge.position import PositionDoc
from deltaforge.state.deadletters import DeadLetterStore, MemoryDeadLetters

HISTORY = 200  # versions kept per key


def sink_key(source_id: str, sink_id: str) -> str:
    """The checkpoint key of one sink: ``{source_id}::sink::{sink_id}``."""
    return f"{source_id}::sink::{sink_id}"


def set_back_key(source_id: str, sink_id: str) -> str:
    """Where ``deltaforge checkpoints --rollback`` / ``--forget`` note that a sink's checkpoint
    was set back by hand: ``{source_id}::set_back::{sink_id}``, until the sink's own record of
    what it holds is set back too (``DeliveryWorker``, ``Sink.rewind``)."""
    return f"{source_id}::set_back::{sink_id}"


def set_back_note(how: str) -> PositionDoc:
    """What the note under :func:`set_back_key` says: how (``rollback``, ``forget``, ``deleted``)
    and when."""
    return {"how": how, "at": time.time()}


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One stored version of a checkpoint."""

    version: int
    created_at: float
    size_bytes: int
    value: PositionDoc


class CheckpointStore(ABC):
    """What the CheckpointCommitter and the CLI need from a store."""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Open connections or files."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release them."""

    @abstractmethod
    async def get_many(self, keys: list[str]) -> dict[str, PositionDoc]:
        """Current values of the keys that exist."""

    @abstractmethod
    async def put_many(self, values: dict[str, PositionDoc]) -> None:
        """Store a new version of each key, all or nothing."""

    @abstractmethod
    async def list_all(self) -> dict[str, tuple[int, float, PositionDoc]]:
        """Every key with (version, updated_at, value)."""

    @abstractmethod
    async def versions(self, key: str) -> list[VersionInfo]:
        """Versions of ``key``, oldest first."""

    @abstractmethod
    async def rollback(self, key: str, version: int) -> None:
        """Make ``version``'s value current again (as a new version)."""

    @abstractmethod
    async def record_schema(
        self, source_id: str, table: str, columns: list[dict[str, Any]], position: PositionDoc
    ) -> None:
        """Remember the schema a source used for ``table`` from ``position`` on."""

    @abstractmethod
    async def schema_history(self, source_id: str, table: str) -> list[dict[str, Any]]:
        """Schemas recorded for ``table``, oldest first: ``{columns, position, recorded_at}``."""

    @abstractmethod
    async def delete_keys(self, keys: list[str]) -> None:
        """Forget these checkpoints, their versions too (a deleted pipeline's)."""

    @property
    @abstractmethod
    def dead_letters(self) -> DeadLetterStore:
        """The dead-letter queue's entries (``state/deadletters.py``)."""

    @abstractmethod
    async def schema_tables(self, source_id: str) -> list[str]:
        """The tables with a recorded schema for ``source_id``, by name."""

    async def get(self, key: str) -> PositionDoc | None:
        return (await self.get_many([key])).get(key)

    async def put(self, key: str, value: PositionDoc) -> None:
        await self.put_many({key: value})


class MemoryCheckpointStore(CheckpointStore):
    """Ephemeral: for tests and throwaway runs."""

    def __init__(self) -> None:
        self._data: dict[str, list[VersionInfo]] = {}
        self._schemas: dict[str, list[dict[str, Any]]] = {}
        self._dead = MemoryDeadLetters(self._persist)

    @property
    def dead_letters(self) -> MemoryDeadLetters:
        return self._dead

    async def record_schema(
        self, source_id: str, table: str, columns: list[dict[str, Any]], position: PositionDoc
    ) -> None:
        hist = self._schemas.setdefault(f"{source_id}::{table}", [])
        record = {"columns": columns, "position": position, "recorded_at": time.time()}
        hist.append(record)
        try:
            await self._persist()
        except BaseException:
            _forget(hist, record)  # not kept: a retry must not record it twice
            raise

    async def schema_history(self, source_id: str, table: str) -> list[dict[str, Any]]:
        return list(self._schemas.get(f"{source_id}::{table}", []))

    async def schema_tables(self, source_id: str) -> list[str]:
        prefix = f"{source_id}::"
        return sorted(k.removeprefix(prefix) for k in self._schemas if k.startswith(prefix))

    async def get_many(self, keys: list[str]) -> dict[str, PositionDoc]:
        return {k: self._data[k][-1].value for k in keys if k in self._data}

    async def put_many(self, values: dict[str, PositionDoc]) -> None:
        now = time.time()
        for key, value in values.items():
            hist = self._data.setdefault(key, [])
            version = hist[-1].version + 1 if hist else 1
            hist.append(VersionInfo(version, now, len(orjson.dumps(value)), value))
            del hist[:-HISTORY]
        await self._persist()

    async def delete_keys(self, keys: list[str]) -> None:
        for key in keys:
            self._data.pop(key, None)
        await self._persist()

    async def _persist(self) -> None:
        """Hook for stores that keep this structure on disk."""

    async def list_all(self) -> dict[str, tuple[int, float, PositionDoc]]:
        return {k: (h[-1].version, h[-1].created_at, h[-1].value) for k, h in self._data.items() if h}

    async def versions(self, key: str) -> list[VersionInfo]:
        return list(self._data.get(key, []))

    async def rollback(self, key: str, version: int) -> None:
        for info in self._data.get(key, []):
            if info.version == version:
                await self.put_many({key: info.value})
                return
        raise KeyError(f"checkpoint {key!r} has no version {version}")


def _forget(items: list[Any], item: object) -> None:
    """Take ``item`` itself (not an equal one) out of ``items``, if it is still there."""
    for i, x in enumerate(items):
        if x is item:
            del items[i]
            return


class FileCheckpointStore(MemoryCheckpointStore):
    """A JSON file rewritten atomically (temp file, fsync, rename, fsync dir)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._writing = asyncio.Lock()

    async def open(self) -> None:
        if self.path.exists():
            raw = orjson.loads(self.path.read_bytes())
            self._data = {k: [VersionInfo(**v) for v in hist] for k, hist in raw["checkpoints"].items()}
            self._schemas = raw.get("schemas", {})
            dlq = raw.get("dead_letters", {})
            self._dead.entries, self._dead.next_seq = dlq.get("entries", []), dlq.get("next_seq", 1)

    async def _persist(self) -> None:
        # One rewrite at a time, of the state as it is when its turn comes. Side by side, two
        # writers' rewrites could land in the other order: the older snapshot replaced the newer
        # one, and a write already reported durable was gone from the file.
        async with self._writing:
            await self._rewrite()

    async def _rewrite(self) -> None:
        checkpoints = {
            k: [
                {
                    "version": v.version,
                    "created_at": v.created_at,
                    "size_bytes": v.size_bytes,
                    "value": v.value,
                }
                for v in hist
            ]
            for k, hist in self._data.items()
        }
        dead = {"entries": self._dead.entries, "next_seq": self._dead.next_seq}
        doc = {"checkpoints": checkpoints, "schemas": self._schemas, "dead_letters": dead}
        await in_thread(_atomic_write, self.path, orjson.dumps(doc))


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def open_store(kind: str, path: str) -> CheckpointStore:
    """A store from the ``spec.storage`` settings (not yet opened)."""
    if kind == "sqlite":
        from deltaforge.state.sqlite_store import SqliteCheckpointStore  # it imports this module

        return SqliteCheckpointStore(path)
    if kind == "file":
        return FileCheckpointStore(path)
    if kind == "memory":
        return MemoryCheckpointStore()
    raise ValueError(f"unknown storage type {kind!r}; expected sqlite, file or memory")
