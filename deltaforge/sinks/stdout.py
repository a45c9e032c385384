"""Stdout sink: JSON lines, or short readable lines for a person watching."""

from __future__ import annotations

import sys
from typing import Literal

import anyio.to_thread
from pydantic import Field

from deltaforge.configmodel import SinkConfig, SinkSettings
from deltaforge.envelopes import encode_lines
from deltaforge.events import Event
from deltaforge.position import Position
from deltaforge.sinks.base import Sink

_OP_NAMES = {"c": "insert", "u": "update", "d": "delete", "r": "read"}


def pretty_line(ev: Event) -> str:
    """``orders #12 update  status: new -> paid`` style summary of one event."""
    row = ev.after if ev.after is not None else ev.before or {}
    key = next(iter(row.values()), "?") if row else "?"
    head = f"{ev.source.db}.{ev.table} #{key} {_OP_NAMES.get(ev.op, ev.op):<6}"
    if ev.op == "u" and ev.before is not None and ev.after is not None:
        before = ev.before
        changed = [f"{k}: {before.get(k)!r} -> {v!r}" for k, v in ev.after.items() if before.get(k) != v]
        return f"{head} {', '.join(changed)}"
    body = ", ".join(f"{k}={v!r}" for k, v in row.items() if not isinstance(v, bytes))
    return f"{head} {body}"


class StdoutSinkConfig(SinkSettings):
    """Each event on standard output."""

    format: Literal["pretty", "json"] = Field("json", description="json lines, or pretty lines for a person.")


class StdoutSink(Sink[StdoutSinkConfig]):
    """Writes each batch to standard output (``format: json`` or ``pretty``)."""

    def __init__(self, config: SinkConfig[StdoutSinkConfig]) -> None:
        super().__init__(config)
        self.pretty = self.settings.format == "pretty"

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        if self.pretty:
            data = "".join(pretty_line(e) + "\n" for e in events).encode()
        else:
            data = encode_lines(events, self.config.envelope)
        await anyio.to_thread.run_sync(self._write, data)

    @staticmethod
    def _write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
