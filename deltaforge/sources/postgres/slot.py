"""The replication slot and the WAL it reads, on the source's control connection.

A slot is held by at most one walsender. The one of a stream that just stopped exits when the
server notices its connection closed, in its own time: until then the slot is active, and
moving, dropping or streaming it is refused. Both waits here are for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

import asyncpg
import structlog

from deltaforge.redact import redact
from deltaforge.sources.base import PositionLost, SourceUnavailable
from deltaforge.sources.postgres.holder import HOLDER, Walsender
from deltaforge.sources.postgres.identity import refuse_without_identity
from deltaforge.sources.postgres.names import quote_table
from deltaforge.sources.postgres.pgoutput import format_lsn, parse_lsn
from deltaforge.sources.postgres.position import PgPosition

if TYPE_CHECKING:
    from deltaforge.sources.postgres.watched import Watched

END_BACKEND = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2"
)
"""Ends a backend (a walsender, a question's) by its pid and start: a pid alone may be another
backend's by then."""

T = TypeVar("T")

RELEASE_S = 10.0  # how long a closing source waits for the walsender to let go of the slot
ANSWER_S = 2.0  # a question of that wait unanswered this long: the connection is silent
ADVANCE_TRIES = 600  # 0.1 s apart: a minute for a just-stopped walsender to let go
STALE_END_S = 10.0  # how long an opening waits for the stale walsender it ended to let go
STALE_SIGNAL_EVERY_S = 1.0  # how often that walsender is signalled again meanwhile
DECODING_S = 24 * 3600.0
"""The bound on a question that may take long for reasons no timeout tells from a silent
connection: creating a slot waits for the transactions running then to end, moving or peeking
one decodes the WAL in between. Every other question on the control connection is bounded by
``query_timeout_s`` (its ``command_timeout``)."""


async def create(
    conn: asyncpg.Connection, slot: str, publication: str, tables: list[str], long: Watched
) -> None:
    """The publication (of ``tables``; none listed: all tables) unless it exists, and the slot."""
    if not await conn.fetchval("SELECT 1 FROM pg_publication WHERE pubname = $1", publication):
        target = "FOR TABLE " + ", ".join(quote_table(t) for t in tables) if tables else "FOR ALL TABLES"
        await refuse_without_identity(
            conn, tables or None, f"creating publication {publication!r} {target}", long.who
        )
        await conn.execute(f'CREATE PUBLICATION "{publication}" {target}')
    make = "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
    await long.ask(conn, lambda: conn.execute(make, slot, timeout=DECODING_S), f"creating slot {slot!r}")


WAL_END = "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)::text"
"""How far the server's WAL reaches on disk, as far as it knows: its flush position (a standby: what
it has replayed). Decoding reads no further, so no position deltaforge was handed lies past it."""

FSYNC_OFF = (
    "fsync is off: the WAL deltaforge reads may not be on disk, so a crash of the server's machine can "
    "lose transactions deltaforge has already delivered (a checkpoint past the WAL's end then stops the "
    "pipeline as position lost); set fsync=on"
)


async def check_within_wal(conn: asyncpg.Connection, checkpoint: int) -> None:
    """Raise :class:`PositionLost` for a checkpoint past the end of the server's WAL (:data:`WAL_END`).

    It was read from WAL the server no longer has: restored from a copy of its files (a disk
    snapshot), or a crash of its machine with ``fsync`` off. The server writes new transactions at
    positions deltaforge has passed; the slot, moved to the checkpoint, would stop at the WAL's end
    (``pg_replication_slot_advance`` clamps without a word) and the decoder would skip them as
    delivered. Once new WAL reaches past the checkpoint this no longer shows: that is why it is
    checked at every opening, and deltaforge reconnects as soon as the server is back.
    """
    found = await conn.fetchval(WAL_END)
    end = None if found is None else parse_lsn(str(found))
    if end is not None and checkpoint > end:
        raise PositionLost(
            f"the server's WAL ends at {format_lsn(end)}, before the checkpoint {format_lsn(checkpoint)}: it "
            "lost WAL deltaforge had read and delivered (restored from a copy of its files, or a crash of its "
            "machine with fsync off), and writes new transactions at positions already passed"
        )


COMMITS_FROM = (
    "SELECT substring(data from 3 for 24) FROM pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, "
    "NULL, 'proto_version', '1', 'publication_names', $3, 'messages', 'true') "
    "WHERE get_byte(data, 0) = 67 AND substring(data from 3 for 8) >= $4"
)
"""pgoutput's COMMIT messages (``C``, flags, commit LSN, end LSN, commit time) with a commit LSN at
or after one, from the slot's position on: filtered by the server, so only they come back. With
the stream's options: ``messages`` too, or a transaction holding only a snapshot's watermark (a
logical message) has no COMMIT here, and checkpoints name such transactions. The commit LSN's 8
bytes are big-endian, so they compare as the LSNs do."""
_COMMIT = struct.Struct(">QQq")
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


async def check_same_commit(
    conn: asyncpg.Connection,
    slot: str,
    publication: str,
    checkpoint: PgPosition,
    confirmed: int,
    long: Watched,
) -> None:
    """Raise :class:`PositionLost` when the WAL at the checkpoint's transaction holds another one.

    :func:`check_within_wal` sees a restored server only until its new WAL passes the checkpoint;
    after that the new transactions sit at positions deltaforge passed, and moving the slot to the
    checkpoint skips them as delivered. Probed: a server restored from a copy wrote a COMMIT at the
    very commit and end LSN of the checkpoint's (and would reuse its xid): only the commit time
    differed. So the slot is read, without consuming it, from its position up to that commit, and
    the commit there must carry the checkpoint's time. A heartbeat's checkpoint (an idle source)
    names no transaction of its own: the last one before it is checked, when the slot has not
    passed it (it is then still in the slot's WAL). A quiet heartbeat's (see ``PgPosition.quiet``)
    says more: no transaction committed after that one and before the heartbeat, so the slot is
    read up to the heartbeat, and any commit after that one is a transaction deltaforge never saw.
    That finds a copy taken while the source idled after its last transaction, which holds that
    transaction with its time, whether or not the copy's slot had passed it. Not checked:
    positions without a commit time (written before it was kept).
    """
    last = checkpoint.last_commit
    if last is None or (confirmed > last[0] and not checkpoint.quiet):
        return
    at, ts = last
    upto = checkpoint.lsn if checkpoint.quiet else at + 1
    rows = await _unheld(
        lambda: long.ask(
            conn,
            lambda: conn.fetch(
                COMMITS_FROM,
                slot,
                format_lsn(upto),
                f'"{publication}"',
                at.to_bytes(8, "big"),
                timeout=DECODING_S,
            ),
            f"reading slot {slot!r} at the checkpoint",
        ),
        long.who,
    )
    commits = [_COMMIT.unpack(bytes(r[0])) for r in rows]
    if after := [c for c in commits if c[0] > at]:
        raise PositionLost(
            f"the server's WAL holds a transaction committed {_when(after[0][2])} at "
            f"{format_lsn(after[0][0])}, between the last transaction deltaforge read (commit "
            f"{format_lsn(at)}, committed {_when(ts)}) and its checkpoint {format_lsn(checkpoint.lsn)}, "
            f"where the server had none: {_LOST}"
        )
    times = [c[2] for c in commits]
    if ts in times or confirmed > at:
        return
    found = f"a transaction committed {_when(times[0])}" if times else "no transaction of the publication"
    raise PositionLost(
        f"the server's WAL at the checkpoint's transaction (commit {format_lsn(at)}, committed "
        f"{_when(ts)}) holds {found}: {_LOST}"
    )


_LOST = (
    "it lost WAL deltaforge had read and delivered (restored from a copy of its files, or a crash of "
    "its machine with fsync off), and wrote new transactions at positions already passed"
)


def _when(pg_us: int) -> str:
    return (_PG_EPOCH + timedelta(microseconds=pg_us)).isoformat(timespec="microseconds")


async def _unheld(call: Callable[[], Awaitable[T]], who: str) -> T:
    """``call``, a use of the slot, tried again while a just-stopped walsender still holds it."""
    for _ in range(ADVANCE_TRIES - 1):
        try:
            return await call()
        except asyncpg.ObjectInUseError:
            await asyncio.sleep(0.1)
    try:
        return await call()
    except asyncpg.ObjectInUseError as exc:
        raise SourceUnavailable(f"{who}: {exc}") from None


async def name_durability_risks(conn: asyncpg.Connection, who: str) -> None:
    """Log a warning (``source_durability``) for settings under which a crash of the server's machine
    loses what deltaforge delivered: ``fsync`` off."""
    if await conn.fetchval("SHOW fsync") == "off":
        structlog.get_logger().warning(
            "source_durability", actor="PostgresSource", source=who, risk=FSYNC_OFF
        )


async def advance(conn: asyncpg.Connection, slot: str, lsn: int, long: Watched) -> None:
    """Move the slot to ``lsn`` while no stream of ours holds it (before the decoder starts)."""
    advance = "SELECT pg_replication_slot_advance($1, $2)"
    await _unheld(
        lambda: long.ask(
            conn, lambda: conn.execute(advance, slot, lsn, timeout=DECODING_S), f"moving slot {slot!r}"
        ),
        long.who,
    )


async def released(conn: asyncpg.Connection, slot: str) -> bool:
    """Wait (at most ``RELEASE_S``) until no walsender holds the slot, so a stopped pipeline has
    let go of it (a user's drop right after stopping works, the next reader is not refused).
    Errors (a server going down) end the wait: nothing holds a slot on a server that is down.
    False when a question went unanswered for ``ANSWER_S``: a connection gone silent (its
    server's host vanished) is not waited on for the rest, and is to be dropped."""
    ask = "SELECT active FROM pg_replication_slots WHERE slot_name = $1"
    with contextlib.suppress(Exception):
        async with asyncio.timeout(RELEASE_S):
            while True:
                try:
                    async with asyncio.timeout(ANSWER_S):
                        active = await conn.fetchval(ask, slot)
                except TimeoutError:
                    return False
                if not active:
                    break
                await asyncio.sleep(0.02)  # the server has no notification for it
    return True


async def forget(
    connection: Callable[[], contextlib.AbstractAsyncContextManager[asyncpg.Connection]], slot: str, who: str
) -> None:
    """Drop ``slot`` for a pipeline deleted with its checkpoints: a slot keeps every WAL segment from
    its position on, for ever, and nothing reads it again (the source server's disk filled). One
    another connection holds is left, and said with the command (``slot_left``), as is a server
    that cannot be reached. The publication stays: it holds no WAL, and may be another pipeline's.
    Never raises: the deletion goes on."""
    log = structlog.get_logger().bind(actor="PostgresSource", source=who, slot=slot)
    drop = "SELECT pg_drop_replication_slot('{}')".format(slot.replace("'", "''"))
    try:
        async with connection() as conn:
            holder = await conn.fetchrow(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot
            )
            if holder is None:
                return
            if holder["active_pid"] is None:
                await conn.execute("SELECT pg_drop_replication_slot($1)", slot)
                log.info("slot_dropped", reason="the pipeline was deleted with its checkpoints")
                return
            why = f"it is in use by pid {holder['active_pid']}"
    except Exception as exc:  # noqa: BLE001 - the deletion goes on; the slot is said
        why = redact(f"{type(exc).__name__}: {exc}")
    log.warning(
        "slot_left",
        reason=f"the pipeline was deleted with its checkpoints, and its slot, which keeps WAL on the server "
        f"for ever, could not be dropped ({why}): run {drop} once it is free",
    )


STALE_STREAM = (
    "the walsender of this source's stream from before still held the slot: its connection went silent "
    "(a vanished host, a NAT that forgot it) and the server had not noticed"
)


async def end_stale(
    conn: asyncpg.Connection, slot: str, stale: Walsender | None, who: str, reason: str = STALE_STREAM
) -> None:
    """End ``stale``, the walsender of this source's stream from before (or, as ``reason`` says,
    another backend of this source's given up), if it still holds ``slot``, and wait (at most
    ``STALE_END_S``) until it lets go. One the source's role may not end is left to the server's
    own timeout, said.

    A walsender blocked on its silent connection's full socket spends the first SIGTERM on
    sending that connection its "terminating connection" error, and stays blocked there, no
    longer dying, for as long as TCP keeps the connection (PostgreSQL 15: seen holding the slot
    over two minutes). So it is signalled again every ``STALE_SIGNAL_EVERY_S`` until it is gone:
    the second signal, arriving while it waits to write, ends it without the message."""
    if stale is None or not await _holds(conn, slot, stale):
        return
    log = structlog.get_logger().bind(actor="PostgresSource", source=who, slot=slot, pid=stale[0])
    try:
        await conn.execute(END_BACKEND, *stale)
    except asyncpg.PostgresError as exc:
        log.warning("stale_walsender_left", reason=redact(f"{type(exc).__name__}: {exc}"))
        return
    log.warning("stale_walsender_ended", reason=reason)
    loop = asyncio.get_running_loop()
    signalled = loop.time()
    deadline = signalled + STALE_END_S
    while await _holds(conn, slot, stale) and loop.time() < deadline:
        if loop.time() - signalled >= STALE_SIGNAL_EVERY_S:
            await conn.execute(END_BACKEND, *stale)
            signalled = loop.time()
        await asyncio.sleep(0.05)  # the server has no notification for a backend's exit


async def _holds(conn: asyncpg.Connection, slot: str, walsender: Walsender) -> bool:
    row = await conn.fetchrow(HOLDER.format("$1"), slot)
    return row is not None and (row[0], row[3]) == walsender
