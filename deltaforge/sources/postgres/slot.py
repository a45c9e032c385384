"""The replication slot, on the source's control connection.

A slot is held by at most one walsender. The one of a stream that just stopped exits when the
server notices its connection closed, in its own time: until then the slot is active, and
moving, dropping or streaming it is refused. Both waits here are for that.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.postgres.identity import refuse_without_identity
from deltaforge.sources.postgres.names import quote_table

RELEASE_S = 10.0  # how long a closing source waits for the walsender to let go of the slot
ADVANCE_TRIES = 600  # 0.1 s apart: a minute for a just-stopped walsender to let go


async def create(conn: asyncpg.Connection, slot: str, publication: str, tables: list[str], who: str) -> None:
    """The publication (of ``tables``; none listed: all tables) unless it exists, and the slot."""
    if not await conn.fetchval("SELECT 1 FROM pg_publication WHERE pubname = $1", publication):
        target = "FOR TABLE " + ", ".join(quote_table(t) for t in tables) if tables else "FOR ALL TABLES"
        await refuse_without_identity(
            conn, tables or None, f"creating publication {publication!r} {target}", who
        )
        await conn.execute(f'CREATE PUBLICATION "{publication}" {target}')
    await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)


async def advance(conn: asyncpg.Connection, slot: str, lsn: int, who: str) -> None:
    """Move the slot to ``lsn`` while no stream of ours holds it (before the decoder starts)."""
    for attempt in range(ADVANCE_TRIES):
        try:
            await conn.execute("SELECT pg_replication_slot_advance($1, $2)", slot, lsn)
            return
        except asyncpg.ObjectInUseError as exc:
            if attempt == ADVANCE_TRIES - 1:
                raise SourceUnavailable(f"{who}: {exc}") from None
            await asyncio.sleep(0.1)


async def released(conn: asyncpg.Connection, slot: str) -> None:
    """Wait (at most ``RELEASE_S``) until no walsender holds the slot, so a stopped pipeline has
    let go of it (a user's drop right after stopping works, the next reader is not refused).
    Errors (a server going down) end the wait: nothing holds a slot on a server that is down."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(RELEASE_S):
            while await conn.fetchval("SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot):
                await asyncio.sleep(0.02)  # the server has no notification for it
