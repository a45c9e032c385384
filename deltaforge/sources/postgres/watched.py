"""Questions on the control connection that may rightly take hours, watched from another
connection while they run.

Creating a slot waits for the transactions running then; moving or peeking one decodes the WAL
in between: no timeout tells such a question from one whose connection went silent, so they were
bounded only by ``slot.DECODING_S`` (a day). TCP keepalive (``tcpkeepalive.py``) notices a host
that vanished, but not a server paused with its kernel up (SIGSTOP, the cgroup freezer behind
``docker pause``: the kernel answers the probes), nor a middlebox holding a connection open and
passing nothing. Either held the opening, and the pipeline said ``starting``, until the question's
day was out.

So while such a question runs, a short connection asks every ``query_timeout_s`` what the
question's backend is doing. Working (active, not waiting on its client): the wait goes on, as
long as it takes. No answer, or no connection: the server is unavailable. The backend idle, or
writing to a client that does not read, at two checks in a row: its answer is sent or stuck, and
the connection it goes to is silent; the backend is ended (it may hold the slot) and the
question given up. Either way the opening is an outage, tried again, and the pipeline says
``degraded``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import structlog

from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.postgres.slot import END_BACKEND, end_stale

T = TypeVar("T")
log = structlog.get_logger()

Connect = Callable[[], contextlib.AbstractAsyncContextManager[asyncpg.Connection]]
"""A short connection to the same server (``connections.short``): unreachable or silent, it
raises :class:`SourceUnavailable`."""

BACKEND = (
    "SELECT current_database(), pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)
"""A connection's database and backend, by pid and start: a pid alone may be another backend's
later."""

_WORKING = (
    "SELECT state = 'active' AND coalesce(wait_event, '') NOT IN ('ClientRead', 'ClientWrite'), "
    "pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2"
)
_BLOCKERS = (
    "SELECT pid, application_name, client_addr::text, xact_start::text FROM pg_stat_activity "
    "WHERE pid = ANY($1::int[]) ORDER BY xact_start"
)
GIVEN_UP = (
    "the backend of a question the last opening gave up (its server paused, or its connection silent) "
    "still held the slot"
)
STALLED_CHECKS = 2
"""Checks in a row that find the backend not working before its connection is taken as silent:
one may fall between its answer leaving and the answer arriving."""


class Watched:
    """The control connection's long questions, each watched from ``connect`` every ``every``
    seconds while it runs (see the module's docstring)."""

    def __init__(self, connect: Connect, every: float, who: str, source: str) -> None:
        self.connect = connect
        self.every = every
        self.who = who
        self.source = source
        self.backend: tuple[int, str] | None = None
        """The control connection's backend (:data:`BACKEND`), noted when it opens."""
        self.given_up: tuple[int, str] | None = None
        """The backend of the last question given up: it may still hold the slot (a server
        paused could not be asked to end it), so the next opening ends it (``slot.end_stale``)."""

    async def ask(self, conn: asyncpg.Connection, call: Callable[[], Awaitable[T]], what: str) -> T:
        """``call``'s answer (a question on ``conn``); :class:`SourceUnavailable` if the server
        cannot be reached meanwhile, or ``conn`` went silent (then ``conn`` is dropped)."""
        task = asyncio.ensure_future(call())
        stalled = 0
        said = False
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.every)
                if done:
                    return task.result()
                if self.backend is None:
                    continue  # nothing to ask about: the day's bound alone, as before
                try:
                    async with self.connect() as watch:
                        row = await watch.fetchrow(_WORKING, *self.backend)
                        working = None if row is None else bool(row[0])
                        stalled = 0 if working else stalled + 1
                        if row is not None and row[1] and not said:
                            said = await self._say_waiting(watch, list(row[1]), what)
                        if (working is None or stalled >= STALLED_CHECKS) and not task.done():
                            # It may hold the slot, and would until the server noticed the silence.
                            await watch.execute(END_BACKEND, *self.backend)
                except SourceUnavailable as exc:
                    if task.done():
                        return task.result()
                    self._give_up(conn)
                    raise SourceUnavailable(f"{exc}, while {what} waited") from None
                if task.done():
                    return task.result()  # answered meanwhile: the check's finding is moot
                if working is None or stalled >= STALLED_CHECKS:
                    self._give_up(conn)
                    state = "gone" if working is None else "no longer working on it"
                    raise SourceUnavailable(
                        f"{self.who}: {what}: its backend is {state} and no answer came: the "
                        "connection is silent and is given up"
                    )
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _say_waiting(self, watch: asyncpg.Connection, pids: list[int], what: str) -> bool:
        """Log (once a question) the transactions it waits for: creating a slot waits for every
        transaction running then, and only a warning tells why the pipeline is still starting."""
        rows = await watch.fetch(_BLOCKERS, pids)
        log.warning(
            "waiting_for_transactions",
            actor="PostgresSource",
            source=self.source,
            question=what,
            transactions=[
                {"pid": r[0], "application": r[1] or None, "client": r[2], "since": r[3]} for r in rows
            ],
            reason="it starts only once no transaction running when it was asked is left: end them, "
            "or wait for them",
        )
        return True

    async def end_given_up(self, conn: asyncpg.Connection, slot: str) -> None:
        """End the backend of the question given up last, if it still holds ``slot``."""
        if self.given_up is not None:
            await end_stale(conn, slot, self.given_up, self.who, reason=GIVEN_UP)
            self.given_up = None

    def _give_up(self, conn: asyncpg.Connection) -> None:
        self.given_up = self.backend
        conn.terminate()
