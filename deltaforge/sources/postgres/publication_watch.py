"""The publication watched for one PostgreSQL source: compared at each opening with what the
last one noted, and asked again every few seconds while streaming (the checks themselves:
``publication.py``)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import asyncpg
import structlog

from deltaforge.sources.base import PositionLost
from deltaforge.sources.postgres.enums import EnumWatch
from deltaforge.sources.postgres.errors import is_unavailable
from deltaforge.sources.postgres.partitions import PartitionWatch
from deltaforge.sources.postgres.publication import (
    Memberships,
    check_publication,
    dropped,
    left_out,
    memberships,
    out_in_between,
)
from deltaforge.sources.postgres.retention import SlotRetention
from deltaforge.sources.saidonce import SaidOnce


class PublicationWatch:
    """What the publication covers for one source. pgoutput stops sending a table taken out of
    the publication (or a kind of change it stops publishing), says nothing, and never sends
    those changes later, even once it is put back: the position is lost for them. So each
    opening compares the publication with what the last one noted (:meth:`memo`, kept beside the
    checkpoints), and while streaming it is asked again every ``every_s``, on the control
    connection, in a task of its own: a server that does not answer (a half-open network) must
    not hold up reading, whose own checks notice it."""

    every_s = 5.0

    def __init__(self, publication: str, listed: list[str], retention: SlotRetention | None = None) -> None:
        self.publication = publication
        self.retention = retention
        """The slot's WAL, looked at with each check (on the same connection, which runs one query at a time)."""
        self.listed = listed
        """The tables the publication must have (none: it publishes all tables)."""
        self.at_open: Memberships | None = None
        self._task: asyncio.Task[str | None] | None = None
        self._next = 0.0
        self.named: set[str] = set()
        """Tables whose drop was logged (once each)."""
        self.partitions = PartitionWatch()
        self.enums = EnumWatch(listed)
        self._failures = SaidOnce()

    async def opened(
        self, conn: asyncpg.Connection, noted: dict[str, Any] | None, resuming: bool, create: bool, who: str
    ) -> None:
        """At open: a listed table taken out of the publication since ``noted`` (while no pipeline
        ran; maybe put back, or about to be added again by :func:`check_publication`) had its
        changes of that time never published, so ``resuming`` from a checkpoint is position lost
        for it. Then the publication's own checks, and what it covers now is noted."""
        same = resuming and noted is not None and noted.get("publication_name") == self.publication
        if same:
            now = await memberships(conn, self.publication, self.listed)
            if (out := out_in_between(noted or {}, now, self.publication)) is not None:
                raise PositionLost(f"{out} since the last run: what it left out was never published")
        await check_publication(conn, self.publication, self.listed, create, who)
        self.at_open = await memberships(conn, self.publication, self.listed)
        if same and self.at_open is not None:
            self._via_root_changed((noted or {}).get("via_root"), self.at_open["via_root"])
        if self.at_open is not None:
            await self.partitions.opened(
                conn, self.at_open["oids"], (noted or {}).get("partitions") if same else None
            )
            await self.enums.opened(conn, self.publication, (noted or {}).get("enums") if same else None)
        if self.listed and self.at_open is not None and self.at_open["unlogged"]:
            # (all tables: check_publication named them) published by their schema, which does not
            # keep a table from being unlogged: nothing of it reaches the WAL
            structlog.get_logger().warning(
                "unlogged_tables_not_captured", actor="PostgresSource", publication=self.publication,
                tables=self.at_open["unlogged"],
                reason="unlogged tables are not written to the WAL, so logical decoding never sees their changes",
            )  # fmt: skip
        self._next = 0.0

    def memo(self) -> dict[str, Any] | None:
        """What the next opening compares with (None before an opening)."""
        if self.at_open is None:
            return None
        return {
            "publication_name": self.publication, **self.at_open,
            "partitions": self.partitions.memo(), "enums": self.enums.memo(),
        }  # fmt: skip

    def poll(self, conn: asyncpg.Connection | None) -> None:
        """Raise :class:`PositionLost` when the last check found something left out, and
        :class:`TimeoutError` when it went unanswered; start the next check when one is due."""
        task = self._task
        if task is not None and task.done():
            self._task = None
            failed = None if task.cancelled() else task.exception()
            if isinstance(failed, TimeoutError):
                # Unanswered within the connection's command_timeout: a silent control connection
                # would time out every check from now on, each said as nothing (a lost connection
                # is the stream's to notice). Raised: the source is opened again on a new one.
                raise failed
            if failed is not None:
                self._failed(failed, conn)
            elif not task.cancelled():
                self._failures.through()
            gone = None if task.cancelled() or failed is not None else task.result()
            if gone is not None:
                raise PositionLost(f"{gone} while streaming: what it left out was never decoded")
        if self._task is None and time.monotonic() >= self._next:
            self._next = time.monotonic() + self.every_s
            if conn is not None and not conn.is_closed():
                self._task = asyncio.get_running_loop().create_task(self._ask(conn))

    def _failed(self, exc: BaseException, conn: asyncpg.Connection | None) -> None:
        """A check that raised: the guarantees it keeps are not kept until one goes through, so say
        why, once per distinct error (every 5 s would drown the log). A lost connection is not
        said: the stream's own reading notices it and reconnects. Nor is a connection closed
        under the check (by the server, between the source's look at it and the check's first
        question): asyncpg says ``InterfaceError: connection is closed`` there, and the next
        read opens the source again."""
        if is_unavailable(exc) or (conn is not None and conn.is_closed()):
            return
        if (error := self._failures.new(exc)) is not None:
            structlog.get_logger().warning(
                "publication_check_failed", actor="PostgresSource", publication=self.publication, error=error,
                reason="the publication, partitions and slot checks did not run; tried again in "
                f"{self.every_s:g} s",
            )  # fmt: skip

    async def _ask(self, conn: asyncpg.Connection) -> str | None:
        """What the publication left out since open (None: nothing); a listed table dropped since
        is said once (its rows stay in the sinks: nothing is sent for a DROP TABLE), and partitions
        attached or detached since the last ask (see ``partitions.py``), enum labels renamed
        (``enums.py``); and the WAL the slot keeps
        (``retention.py``)."""
        if self.retention is not None:
            await self.retention.check(conn)
        gone, now = await left_out(conn, self.publication, self.listed, self.at_open)
        if gone is None and now is not None:
            await self.partitions.check(conn, now["oids"])
            await self.enums.check(conn, self.publication)
            if self.at_open is not None and self._via_root_changed(
                self.at_open.get("via_root"), now["via_root"]
            ):
                self.at_open["via_root"] = now["via_root"]
        if gone is None and now is not None and self.at_open is not None:
            for table in await dropped(conn, self.at_open, now, self.named):
                self.named.add(table)
                structlog.get_logger().warning(
                    "captured_table_dropped", actor="PostgresSource", table=table,
                    reason="DROP TABLE sends no change: the rows the sinks hold of it stay there",
                )  # fmt: skip
        return gone

    def _via_root_changed(self, was: bool | None, now: bool) -> bool:
        """``publish_via_partition_root`` switched (``was`` None: not noted): partitioned tables'
        changes arrive under another name, so sinks routing by table put them elsewhere. Nothing
        is lost: said, not halted on."""
        if was is None or was == now:
            return False
        structlog.get_logger().warning(
            "publication_via_root_changed", actor="PostgresSource", publication=self.publication,
            publish_via_partition_root=now,
            reason="changes of partitioned tables now arrive under "
            + ("the partitioned table's name" if now else "each partition's name")
            + "; sinks that route by table name now put them elsewhere",
        )  # fmt: skip
        return True

    async def stop(self) -> bool:
        """Cancel a check in flight, and start none until the next opening; True when it was
        still waiting for its answer, which leaves the connection mid-query (to be dropped, not
        closed politely: that would wait on it too)."""
        self._next = math.inf
        task, self._task = self._task, None
        if task is None:
            return False
        interrupted = not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return interrupted
