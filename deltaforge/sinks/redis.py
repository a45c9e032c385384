"""Redis Streams sink: pipelined XADD, idempotency keys, optional exactly-once watermarks.

Default (at-least-once): each event is ``XADD stream * event <json> idempotency_key <key>``,
a batch is one pipeline round trip. Consumers dedup on ``idempotency_key``.

``exactly_once: true`` goes beyond the reference: every stream keeps a watermark
(``<stream>:df:watermark``) of the last source position written to it, and a Lua
script adds only entries past the watermark and moves it, atomically per stream.
A replay after a crash is then a no-op on the server: one entry per source change.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Annotated, Any

import redis.asyncio as aioredis
from pydantic import Field
from redis import exceptions as rex

from deltaforge.configmodel import Bool, NonNegativeInt, SinkConfig, SinkSettings, Text, matching
from deltaforge.envelopes import encode, shape
from deltaforge.events import Event
from deltaforge.position import Position
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, Sink
from deltaforge.sinks.templates import Template, compile_template

_EXACTLY_ONCE = """
local wm = redis.call('GET', KEYS[2]) or ''
local maxlen = tonumber(ARGV[1])
local added = 0
local last = wm
for i = 2, #ARGV, 3 do
  local pos = ARGV[i]
  if pos > last then
    if maxlen > 0 then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'event', ARGV[i + 1], 'idempotency_key', ARGV[i + 2])
    else
      redis.call('XADD', KEYS[1], '*', 'event', ARGV[i + 1], 'idempotency_key', ARGV[i + 2])
    end
    last = pos
    added = added + 1
  end
end
if last ~= wm then redis.call('SET', KEYS[2], last) end
return added
"""


def position_text(order: tuple[int, ...]) -> str:
    """A source position as text that sorts like the tuple (fixed-width hex per part)."""
    return ".".join(f"{p:016x}" for p in order)


RedisUri = Annotated[Text, matching(r"^rediss?://", "expected redis://[user:password@]host:port[/db]")]


class RedisSinkConfig(SinkSettings):
    """Redis Streams: one XADD per event."""

    uri: RedisUri = Field(description="redis://[user:password@]host:port[/db]")
    stream: Template = Field(description="Stream per event, e.g. cdc.${source.table}.")
    maxlen: NonNegativeInt = Field(0, description="Trim each stream to about this many entries (0: never).")
    exactly_once: Bool = Field(
        False, description="Skip what a stream already holds (a watermark per stream)."
    )


class RedisSink(Sink[RedisSinkConfig]):
    """Appends events to Redis Streams named by a template (``cdc.${source.table}``)."""

    def __init__(self, config: SinkConfig[RedisSinkConfig]) -> None:
        super().__init__(config)
        cfg = self.settings
        self.uri = cfg.uri
        self.stream_of = compile_template(cfg.stream)
        self.maxlen = cfg.maxlen
        self.exactly_once = cfg.exactly_once
        self.envelope = shape(config.envelope)
        self._client: aioredis.Redis | None = None
        self._script: Any = None

    async def open(self) -> None:
        self._client = aioredis.from_url(self.uri, socket_timeout=10, socket_connect_timeout=5)
        self._script = self._client.register_script(_EXACTLY_ONCE)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        if self._client is None:
            await self.open()
        with self._errors():
            if self.exactly_once:
                await self._deliver_exactly_once(events)
            else:
                await self._deliver_pipelined(events)

    async def reachable(self) -> None:
        if self._client is None:
            await self.open()
        assert self._client is not None
        with self._errors():
            await self._client.ping()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Redis errors as sink errors: refused credentials cannot be retried, the rest can."""
        try:
            yield
        except (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError) as exc:
            raise NonRetryableSinkError(f"redis sink {self.id!r}: {exc}") from None
        except rex.ResponseError as exc:
            text = str(exc)
            if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
                raise NonRetryableSinkError(f"redis sink {self.id!r}: {text}") from None
            raise RetryableSinkError(f"redis sink {self.id!r}: {text}") from None
        except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
            raise RetryableSinkError(f"redis sink {self.id!r}: {type(exc).__name__}: {exc}") from None

    async def _deliver_pipelined(self, events: list[Event]) -> None:
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        maxlen = self.maxlen or None
        for e in events:
            fields: dict[Any, Any] = {"event": encode(self.envelope(e)), "idempotency_key": e.idempotency_key}
            pipe.xadd(self.stream_of(e), fields, maxlen=maxlen, approximate=True)
        await pipe.execute()

    async def _deliver_exactly_once(self, events: list[Event]) -> None:
        assert self._client is not None
        by_stream: dict[str, list[Any]] = defaultdict(list)
        for e in events:
            by_stream[self.stream_of(e)].extend(
                (position_text(e.order), encode(self.envelope(e)), e.idempotency_key)
            )
        pipe = self._client.pipeline(transaction=False)
        for stream, args in by_stream.items():
            await self._script(
                keys=[stream, f"{stream}:df:watermark"], args=[self.maxlen, *args], client=pipe
            )
        await pipe.execute()
