"""The SQLite checkpoint store (the default): checkpoints with their version history, schema
history, and the dead letters' table, in one WAL-mode database written one transaction at a
time (``sqlitewrites.py``)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import orjson

from deltaforge.position import PositionDoc
from deltaforge.state.checkpoints import HISTORY, CheckpointStore, VersionInfo
from deltaforge.state.deadletters import SCHEMA as DEAD_LETTERS_SCHEMA
from deltaforge.state.deadletters import SqliteDeadLetters
from deltaforge.state.sqlitewrites import SerialWrites

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    key TEXT PRIMARY KEY, version INTEGER NOT NULL, value BLOB NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoint_versions (
    key TEXT NOT NULL, version INTEGER NOT NULL, value BLOB NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (key, version));
CREATE TABLE IF NOT EXISTS schemas (
    source_id TEXT NOT NULL, tbl TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT,
    columns BLOB NOT NULL, position BLOB NOT NULL, recorded_at REAL NOT NULL);
"""


class _SqliteSchemas:
    """Schema history rows of the SQLite store (mixed into it)."""

    _writes: SerialWrites

    @property
    def db(self) -> aiosqlite.Connection:
        raise NotImplementedError

    async def record_schema(
        self, source_id: str, table: str, columns: list[dict[str, Any]], position: PositionDoc
    ) -> None:
        async with self._writes.transaction() as db:
            await db.execute(
                "INSERT INTO schemas(source_id, tbl, columns, position, recorded_at) VALUES (?, ?, ?, ?, ?)",
                (source_id, table, orjson.dumps(columns), orjson.dumps(position), time.time()),
            )

    async def schema_history(self, source_id: str, table: str) -> list[dict[str, Any]]:
        async with self.db.execute(
            "SELECT columns, position, recorded_at FROM schemas WHERE source_id = ? AND tbl = ? ORDER BY seq",
            (source_id, table),
        ) as cur:
            rows = await cur.fetchall()
        return [
            {"columns": orjson.loads(c), "position": orjson.loads(p), "recorded_at": t} for c, p, t in rows
        ]

    async def schema_tables(self, source_id: str) -> list[str]:
        async with self.db.execute(
            "SELECT DISTINCT tbl FROM schemas WHERE source_id = ? ORDER BY tbl", (source_id,)
        ) as cur:
            return [str(r[0]) for r in await cur.fetchall()]


WAL_SWITCH_TRIES = 100  # 10 s at 0.1 s


async def _wal(db: aiosqlite.Connection) -> None:
    """Switch to WAL. The switch takes an exclusive lock and SQLite answers "database is locked" at
    once, without the busy handler, while another connection opens the same new file: pipelines
    sharing one store start together, so try again for a while."""
    for attempt in range(WAL_SWITCH_TRIES):
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == WAL_SWITCH_TRIES - 1:
                raise
        await anyio.sleep(0.1)


class SqliteCheckpointStore(_SqliteSchemas, CheckpointStore):
    """SQLite in WAL mode with synchronous=FULL: a committed write survives SIGKILL and power loss.

    FULL, not NORMAL: a source may release what lies before a checkpoint for good (the
    PostgreSQL slot is advanced, binlogs may expire), so a checkpoint must be on disk
    before anyone acts on it. NORMAL in WAL mode can lose the last commits on power loss.
    It costs one fsync of the WAL per batch.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: aiosqlite.Connection | None = None
        self._writes = SerialWrites(lambda: self.db)
        self._dead = SqliteDeadLetters(self._writes)

    @property
    def dead_letters(self) -> SqliteDeadLetters:
        return self._dead

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(self.path)
        try:
            await db.execute("PRAGMA busy_timeout=5000")
            await _wal(db)
            await db.execute("PRAGMA synchronous=FULL")
            await db.executescript(_SCHEMA)
            await db.executescript(DEAD_LETTERS_SCHEMA)
            await db.commit()
        except BaseException:
            await db.close()
            raise
        self._db = db

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError(f"checkpoint store {self.path} is not open")
        return self._db

    async def delete_keys(self, keys: list[str]) -> None:
        marks = ",".join("?" * len(keys))
        async with self._writes.transaction() as db:
            await db.execute(f"DELETE FROM checkpoints WHERE key IN ({marks})", keys)
            await db.execute(f"DELETE FROM checkpoint_versions WHERE key IN ({marks})", keys)

    async def get_many(self, keys: list[str]) -> dict[str, PositionDoc]:
        if not keys:
            return {}
        marks = ",".join("?" * len(keys))
        async with self.db.execute(f"SELECT key, value FROM checkpoints WHERE key IN ({marks})", keys) as cur:
            return {k: orjson.loads(v) for k, v in await cur.fetchall()}

    async def put_many(self, values: dict[str, PositionDoc]) -> None:
        now = time.time()
        async with self._writes.transaction() as db:
            for key, value in values.items():
                blob = orjson.dumps(value)
                async with db.execute("SELECT version FROM checkpoints WHERE key = ?", (key,)) as cur:
                    row = await cur.fetchone()
                version = (row[0] if row else 0) + 1
                await db.execute(
                    "INSERT INTO checkpoints(key, version, value, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET version=excluded.version, value=excluded.value, "
                    "updated_at=excluded.updated_at",
                    (key, version, blob, now),
                )
                await db.execute(
                    "INSERT INTO checkpoint_versions(key, version, value, created_at) VALUES (?, ?, ?, ?)",
                    (key, version, blob, now),
                )
                if version % 50 == 0:
                    await db.execute(
                        "DELETE FROM checkpoint_versions WHERE key = ? AND version <= ?",
                        (key, version - HISTORY),
                    )

    async def list_all(self) -> dict[str, tuple[int, float, PositionDoc]]:
        async with self.db.execute(
            "SELECT key, version, updated_at, value FROM checkpoints ORDER BY key"
        ) as cur:
            return {k: (v, t, orjson.loads(b)) for k, v, t, b in await cur.fetchall()}

    async def versions(self, key: str) -> list[VersionInfo]:
        async with self.db.execute(
            "SELECT version, created_at, value FROM checkpoint_versions WHERE key = ? ORDER BY version",
            (key,),
        ) as cur:
            return [VersionInfo(v, t, len(b), orjson.loads(b)) for v, t, b in await cur.fetchall()]

    async def rollback(self, key: str, version: int) -> None:
        async with self.db.execute(
            "SELECT value FROM checkpoint_versions WHERE key = ? AND version = ?", (key, version)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            raise KeyError(f"checkpoint {key!r} has no version {version}")
        await self.put_many({key: orjson.loads(row[0])})
