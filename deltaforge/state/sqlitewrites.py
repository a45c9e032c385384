"""One write transaction at a time on the SQLite store's one connection.

Every writer of the store (the checkpoint committer, the reader's schema history, the DLQ, the
reconciler, the snapshot progress) shares one aiosqlite connection, and each of its writes is
several statements with an ``await`` between them. Interleaved, they shared a transaction: one
writer's COMMIT made another's half-done write durable (a batch's checkpoints no longer all or
none), and one writer's ROLLBACK undid statements another writer had already counted as
committed. On a full disk that lost dead letters: the DLQ's entry went into the committer's
transaction, the committer's failed commit rolled it back, and the DLQ's own COMMIT then
"succeeded" with nothing in it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiosqlite
import anyio


class SerialWrites:
    """``async with writes.transaction() as db:`` statements, committed together or rolled back
    together, with no other writer's statements among them."""

    def __init__(self, db: Callable[[], aiosqlite.Connection]) -> None:
        self._db = db
        self._lock = asyncio.Lock()

    @property
    def db(self) -> aiosqlite.Connection:
        """The connection, for reads (which see committed data and the running transaction's)."""
        return self._db()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            db = self._db()
            try:
                yield db
                await db.commit()
            except BaseException:
                # Shielded: cancelled (an actor restarted) mid-write, the rollback must still run,
                # or the statements so far would go out with the next writer's COMMIT.
                with anyio.CancelScope(shield=True):
                    try:
                        await db.rollback()
                    except (sqlite3.Error, ValueError):
                        pass  # the connection is closed or broken: nothing of it is committed
                raise
