"""Store writes that wait out a full disk: unavailable is not crashed, for the state store too.

A checkpoint store on a full disk failed every write. Raised, each failure restarted the
pipeline's actors (reading the source again from the last durable checkpoint) until the restart
limit stopped the pipeline for good, although freeing space would have fixed it. Now a write is
tried again, with backoff, until it holds, and the pipeline is ``degraded`` meanwhile, naming
the store and the error.
"""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from collections.abc import Awaitable, Callable
from typing import TypeVar

from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.runningtimer import RunningTimer
from supervision import Backoff

WAITED_FOR = (sqlite3.OperationalError, OSError)
"""What a store write fails with while its disk is full (or its file is locked, or briefly cannot
be written). A damaged database (a ``sqlite3.DatabaseError`` that is not an ``OperationalError``)
is not among them: retrying cannot mend it, and it is raised."""

T = TypeVar("T")


def refused_write(exc: BaseException) -> bool:
    """What a store that cannot even be opened fails with while its disk refuses writes (full,
    over quota, past a file-size limit) or fails them: SQLite's "database or disk is full" and
    "disk I/O error" (creating the WAL's shared-memory file, say), or the same from the OS. A path
    that cannot be opened at all (a missing parent, a file where a folder should be) is not among
    them: retrying cannot mend it."""
    if isinstance(exc, sqlite3.OperationalError):
        name = str(getattr(exc, "sqlite_errorname", ""))
        return name == "SQLITE_FULL" or name.startswith("SQLITE_IOERR")
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


UNANSWERED_S = 30.0
OUTAGE = "state_store"
"""How the store is listed in ``/health`` while its writes fail."""


class PatientWrites:
    """Runs a store write until it holds (see the module): ``await patient(lambda: store.put(k, v))``."""

    def __init__(
        self, ctx: PipelineContext, waits_for: Callable[[BaseException], bool] | None = None
    ) -> None:
        self.ctx = ctx
        self.waits_for = waits_for or (lambda exc: isinstance(exc, WAITED_FOR))
        sup = ctx.config.supervision
        self.backoff = Backoff(sup.backoff_base_ms / 1000, sup.backoff_max_ms / 1000)

    async def __call__(self, write: Callable[[], Awaitable[T]]) -> T:
        availability, attempt, me = self.ctx.availability, 0, object()  # one caller among the writers
        timer = RunningTimer(
            asyncio.get_running_loop(),
            UNANSWERED_S,
            lambda: availability.down(
                OUTAGE, f"a write unanswered for {UNANSWERED_S:g} s (still trying)", me
            ),
        )
        try:
            while True:
                try:
                    result = await write()
                    break
                except Exception as exc:
                    if not self.waits_for(exc):
                        raise
                    attempt += 1
                    availability.down(OUTAGE, f"{type(exc).__name__}: {exc} (still trying)", me)
                    await self.ctx.clock.sleep(self.backoff.delay(min(attempt, 30), self.ctx.rng))
        finally:
            timer.cancel()
            availability.forget(OUTAGE, me)  # raised or cancelled: no longer failing, not recovered
        availability.up(OUTAGE, me)
        return result
