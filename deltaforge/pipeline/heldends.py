"""A sink's acknowledged marks kept between runs, so a loss while deltaforge was stopped is named.

A sink that compares where its server's streams end with what they acknowledged
(``sinks/acknowledged.py``: Redis, NATS, Kafka's default mode) knows those marks only from the
batches of its own run. A server that lost data while deltaforge was stopped as well (one power
cut for both, a restore while the pipeline was down) would go unnoticed: the new run starts from
the checkpoint, past what was lost, with no mark to compare. The delivery worker therefore keeps
the marks in the checkpoint store (``<source>::acknowledged::<sink>``, with the sink's
:attr:`~deltaforge.sinks.base.Sink.target`), at most every few seconds and when it stops, and
gives them back to the sink when it starts. Marks kept while the sink wrote to other servers (its
config changed) are not compared: a new, empty server is not a loss.

A sink that records its position with its data (Kafka ``exactly_once``) has one mark: the position
its last committed batch recorded (:attr:`~deltaforge.sinks.base.Sink.acknowledged`). It is kept
the same way, and the worker compares the record it reads back at its next opening with it.

A mark kept may be behind the newest one (saved every few seconds), never ahead of what the
server acknowledged: a loss is never named where there was none, and a loss of only what was
acknowledged after the last saving is not seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from deltaforge.position import Position, PositionDoc
from deltaforge.sinks.base import Sink
from deltaforge.state.checkpoints import CheckpointStore

SAVE_EVERY_S = 5.0
"""Marks are written to the store at most this often while batches flow (and when the worker stops)."""


def held_key(source_id: str, sink_id: str) -> str:
    """Where one sink's marks are kept: ``{source_id}::acknowledged::{sink_id}``."""
    return f"{source_id}::acknowledged::{sink_id}"


class HeldEnds:
    """One sink's marks, loaded from and saved to the checkpoint store by its delivery worker."""

    def __init__(
        self, store: CheckpointStore, key: str, sink: Sink[Any], position: Callable[[PositionDoc], Position]
    ) -> None:
        self.store, self.key, self.sink = store, key, sink
        self.position = position
        """Reads a kept position (the source's ``load_position``)."""
        self.saved: dict[str, Any] | None = None
        self.saved_at = 0.0

    @property
    def _kept(self) -> bool:
        return self.sink.acked_ends is not None or self.sink.records_position

    async def load(self) -> None:
        """Give the sink the marks an earlier run kept for the same servers."""
        if not self._kept:
            return
        try:
            doc = await self.store.get(self.key)
        except Exception as exc:  # noqa: BLE001 - without them, only this run's losses are seen
            self._not_kept("load", exc)
            return
        if doc is None or doc.get("target") != self.sink.target:
            return
        ends, kept, acknowledged = self.sink.acked_ends, doc.get("ends"), doc.get("acknowledged")
        if ends is not None and isinstance(kept, dict):
            ends.restore(kept)
        if self.sink.records_position and self.sink.acknowledged is None and isinstance(acknowledged, dict):
            self.sink.acknowledged = self.position(acknowledged)
        self.saved = self._marks()

    async def save(self, now: bool = False) -> None:
        """Keep the sink's marks, if they moved and (unless ``now``) none were kept for a while."""
        if not self._kept or (not now and time.monotonic() - self.saved_at < SAVE_EVERY_S):
            return
        doc = self._marks()
        if doc == self.saved:
            return
        self.saved_at = time.monotonic()
        try:
            await self.store.put(self.key, {"target": self.sink.target, **doc})
        except Exception as exc:  # noqa: BLE001 - a store that refuses writes (disk full) holds checkpoints up too
            self._not_kept("save", exc)
            return
        self.saved = doc

    def _marks(self) -> dict[str, Any]:
        ends, acknowledged = self.sink.acked_ends, self.sink.acknowledged
        marks: dict[str, Any] = {}
        if ends is not None:
            marks["ends"] = ends.to_doc()
        if self.sink.records_position and acknowledged is not None:
            marks["acknowledged"] = acknowledged.to_doc()
        return marks

    def _not_kept(self, what: str, exc: Exception) -> None:
        structlog.get_logger().info(
            "acknowledged_ends_not_kept", actor="DeliveryWorker", sink=self.sink.id, step=what,
            reason=f"{type(exc).__name__}: {exc}",
        )  # fmt: skip
