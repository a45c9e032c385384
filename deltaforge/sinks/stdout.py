"""Stdout sink: JSON lines, or short readable lines for a person watching."""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import Field

from actors import in_thread
from deltaforge.configmodel import SinkConfig, SinkSettings
from deltaforge.envelopes import encode_lines
from deltaforge.events import Event
from deltaforge.position import Position
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, Sink

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
        try:
            await in_thread(self._write, data)
        except BrokenPipeError:
            _stdout_to_devnull()
            raise NonRetryableSinkError(
                f"stdout sink {self.id!r}: standard output is closed (broken pipe): what read it has "
                "gone (a `| head` that has its lines, a pager quit), and nothing written there can "
                "arrive any more. The sink is given up until serve starts again"
            ) from None
        except OSError as exc:  # a full disk under a redirect, say: waited for, as any sink server
            raise RetryableSinkError(f"stdout sink {self.id!r}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def _stdout_to_devnull() -> None:
    """Standard output's descriptor pointed at /dev/null, what its buffer still holds dropped: the
    interpreter flushes it at exit, which would fail again and print a BrokenPipeError after
    serve's last log line (what Python's documentation of SIGPIPE advises)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
