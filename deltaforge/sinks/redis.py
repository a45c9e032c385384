"""Redis Streams sink: XADDs by a Lua script per stream, idempotency keys, optional exactly-once watermarks.

Default (at-least-once): each event is ``XADD stream * event <json> idempotency_key <key>``.
Consumers dedup on ``idempotency_key``.

``exactly_once: true`` goes beyond the reference: every stream keeps a watermark per pipeline
(``<stream>:df:watermark:<pipeline>:<deployment>``) of the last source position it wrote there, and a Lua
script adds only entries past the watermark and moves it, atomically per stream. A replay
after a crash is then a no-op on the server: one entry per source change. Per pipeline, since
positions of two sources fanned into one stream do not sort against each other.

In both modes the XADDs are made by a Lua script, one call per stream and up to ``PER_CALL``
events, all of a batch's calls in one pipeline round trip. A command costs redis-py far more
than an entry costs the script, so a batch costs one command per stream rather than one per
event (docs/performance.md). The scripts are sent by hash; a server that has lost them (a
restart, ``SCRIPT FLUSH``) is sent them again. Where the sink's user may not run scripts
(``NOPERM``), the default mode falls back to one pipelined XADD per event and says so once in
the log; ``exactly_once`` cannot do without its script, so there the refusal stops the sink.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Annotated, Any

import redis.asyncio as aioredis
import structlog
from pydantic import Field
from redis import exceptions as rex

from deltaforge.configmodel import (
    Bool,
    NonNegativeInt,
    SinkConfig,
    SinkSettings,
    Text,
    matching,
    server_addresses,
)
from deltaforge.envelopes import encoder
from deltaforge.events import Event
from deltaforge.position import Position, lane_of, position_text
from deltaforge.sinks import durability
from deltaforge.sinks.acknowledged import AckedEnds
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, Sink, servers_of
from deltaforge.sinks.redis_memory import refuses_writes
from deltaforge.sinks.redis_scripts import APPEND, EXACTLY_ONCE, PER_CALL, Call
from deltaforge.sinks.templates import Template, compile_template, glob_of

RedisUri = Annotated[
    Text,
    matching(r"^rediss?://", "expected redis://[user:password@]host:port[/db]"),
    server_addresses("expected redis://[user:password@]host:port[/db]"),
]


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
        self.streams = glob_of(cfg.stream)  # a MATCH pattern of every stream it writes
        self.maxlen = cfg.maxlen
        self.exactly_once = cfg.exactly_once
        self.encode = encoder(config.envelope)
        self._client: aioredis.Redis | None = None
        self._script: Any = None
        self._append: Any = None  # the default mode's script: dead letters go in with it too
        self._scripted = True  # False once the server refused the default mode's script
        self._settings_read = False
        self.target = servers_of([self.uri], 6379)
        self.acked = self.acked_ends = AckedEnds[tuple[int, int]](self.id, "RedisSink", "stream ID")

    async def open(self) -> None:
        self._client = aioredis.from_url(self.uri, socket_timeout=10, socket_connect_timeout=5)
        self._append = self._client.register_script(APPEND)
        self._script = self._client.register_script(EXACTLY_ONCE) if self.exactly_once else self._append

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        await self._deliver(events, self.exactly_once)

    async def deliver_dead_letters(self, events: list[Event]) -> None:
        """Dead letters are older than the changes delivered after them, so an ``exactly_once``
        stream's watermark is past them: they go in with the default mode's script, leaving the
        watermark where it is (replayed twice, after a crash between the write and the queue's
        ack, one is there twice, with its idempotency key: at-least-once, as the README says)."""
        await self._deliver(events, False)

    async def _deliver(self, events: list[Event], watermarked: bool) -> None:
        if self._client is None:
            await self.open()
        if not self._settings_read:
            await self._read_settings()
        by_stream: dict[tuple[str, str], list[Any]] = defaultdict(list)  # by stream and lane
        if watermarked:
            for e in events:
                lane, order = _watermark_of(e)
                by_stream[self.stream_of(e), lane].append(
                    (position_text(order), self.encode(e), e.idempotency_key)
                )
        else:
            for e in events:
                by_stream[self.stream_of(e), ""].append((self.encode(e), e.idempotency_key))
        with self._errors():
            if self._scripted:
                try:
                    calls = [
                        call
                        for (stream, lane), entries in by_stream.items()
                        for call in self._calls(stream, lane, entries, watermarked)
                    ]
                    await self._run(calls, self._script if watermarked else self._append)
                    return
                except rex.NoPermissionError as exc:
                    if self.exactly_once:  # its dead letters too: the fallback would stay for all
                        raise
                    self._scripted = False
                    structlog.get_logger().warning(
                        "redis_scripts_refused", actor="RedisSink", sink=self.id, reason=str(exc),
                        fallback="one pipelined XADD per event",
                    )  # fmt: skip
            await self._xadd({stream: entries for (stream, _), entries in by_stream.items()})

    @property
    def _own(self) -> str:
        """Whose watermarks: ``<pipeline>:<deployment>`` (see :meth:`_calls`)."""
        return f"{self.pipeline}:{self.deployment}" if self.deployment else self.pipeline

    async def rewind(self, position: Position | None) -> None:
        """exactly_once: the watermarks of this pipeline and deployment in the streams this sink
        writes are deleted, so that what comes again from the checkpoint set back is written
        again (all that comes after the rewind is what the operator asked for); the next batches
        set them anew. SCAN finds them: one key per stream (per partition, for a Kafka source)."""
        if not self.exactly_once:
            return
        if self._client is None:
            await self.open()
        assert self._client is not None
        own = self._own
        pattern = f"{self.streams}:df:watermark:{glob_of(own)}*"
        # another pipeline whose name begins with this one's, or (without a deployment) another
        # deployment's, matches the pattern too: only this one's, and its partitions', are kept
        exact = re.compile(rf":df:watermark:{re.escape(own)}(:[A-Za-z0-9._-]+:[0-9]+)?$")
        with self._errors():
            found = [k async for k in self._client.scan_iter(match=pattern, count=1000)
                     if exact.search(k.decode(errors="replace"))]  # fmt: skip
            for i in range(0, len(found), PER_CALL):
                await self._client.delete(*found[i : i + PER_CALL])

    async def _read_settings(self) -> None:
        """Once, before the first batch: what the server's settings risk of acknowledged entries
        (``deltaforge/sinks/durability.py``), and whether it is a Redis Cluster node (refused). A
        server that does not answer is left to the batch to find, and asked again before the next one."""
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        for name in durability.REDIS_SETTINGS:
            pipe.config_get(name)
        try:
            found = await pipe.execute()
        except (rex.ConnectionError, rex.TimeoutError, OSError):
            return
        except rex.RedisError as exc:  # CONFIG refused by an ACL, or renamed away (managed Redis)
            durability.unknown(self.id, "RedisSink", f"CONFIG GET refused: {exc}")
        else:
            config = {str(k): str(v) for part in found for k, v in part.items()}
            durability.report(self.id, "RedisSink", durability.redis_risks(config))
        try:
            cluster = await self._client.info("cluster")
        except (rex.ConnectionError, rex.TimeoutError, OSError):
            return
        except rex.RedisError:
            cluster = {}  # INFO refused: a cluster still says so at the first write (_errors)
        if cluster.get("cluster_enabled"):
            raise NonRetryableSinkError(self._not_a_cluster("the server says cluster_enabled:1"))
        self._settings_read = True

    def _not_a_cluster(self, why: str) -> str:
        return (
            f"redis sink {self.id!r}: the server is a Redis Cluster node ({why}); the sink writes to one "
            "server, each batch's stream and its watermark by one script: give it a standalone Redis "
            "(a primary, with replicas if you like)"
        )

    async def reachable(self) -> None:
        if self._client is None:
            await self.open()
        assert self._client is not None
        with self._errors():
            await self._client.ping()
            why = await refuses_writes(self._client)  # PING is answered at maxmemory too
        if why is not None:
            raise RetryableSinkError(f"redis sink {self.id!r}: {why}")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Redis errors as sink errors: refused credentials, and a stream's name taken by a key of
        another type, cannot be retried; the rest can."""
        try:
            yield
        except (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError) as exc:
            raise NonRetryableSinkError(f"redis sink {self.id!r}: {exc}") from None
        except (rex.AskError, rex.ClusterCrossSlotError) as exc:  # MOVED is an AskError
            # retried for ever before, degraded as if the server were down
            raise NonRetryableSinkError(self._not_a_cluster(f"{type(exc).__name__}: {exc}")) from None
        except rex.ResponseError as exc:
            text = str(exc)
            if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
                raise NonRetryableSinkError(f"redis sink {self.id!r}: {text}") from None
            if text.startswith("WRONGTYPE"):  # it was retried for ever, the pipeline degraded
                raise NonRetryableSinkError(
                    f"redis sink {self.id!r}: a key named as one of its streams holds another type "
                    f"({text}); delete or rename that key, or change stream"
                ) from None
            raise RetryableSinkError(f"redis sink {self.id!r}: {text}") from None
        except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
            raise RetryableSinkError(f"redis sink {self.id!r}: {type(exc).__name__}: {exc}") from None

    def _calls(self, stream: str, lane: str, entries: list[Any], watermarked: bool) -> Iterator[Call]:
        """The script calls adding ``entries`` to ``stream``, ``PER_CALL`` at a time;
        ``watermarked``, past the watermark of their ``lane`` (see :func:`_watermark_of`)."""
        # One per pipeline and deployment: another pipeline's source, or another deployment's of
        # this one (a config deployed once per shard), may write the same stream, and positions
        # of two sources do not sort against each other (one watermark for both dropped every
        # change of the source whose positions were lower).
        watermark = f"{stream}:df:watermark:{self._own}" + (f":{lane}" if lane else "")
        keys = [stream, watermark] if watermarked else [stream]
        for i in range(0, len(entries), PER_CALL):
            yield keys, [self.maxlen, *(v for entry in entries[i : i + PER_CALL] for v in entry)]

    async def _xadd(self, by_stream: dict[str, list[Any]]) -> None:
        """The fallback: one XADD per event, pipelined, in one round trip. Before each stream's
        XADDs, its last ID (``XINFO STREAM``), compared as the scripts' is; other clients' commands
        may come in between, and only move that ID on."""
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        maxlen = self.maxlen or None
        for stream, entries in by_stream.items():
            pipe.xinfo_stream(stream)
            for value, key in entries:
                pipe.xadd(stream, {"event": value, "idempotency_key": key}, maxlen=maxlen, approximate=True)
        results = await pipe.execute(raise_on_error=False)
        ends: list[tuple[str, Any, Any]] = []
        i = 0
        for stream, entries in by_stream.items():
            added = results[i + 1 : i + 1 + len(entries)]
            for r in added:
                if isinstance(r, Exception):
                    raise r
            ends.append((stream, results[i], added[-1]))
            i += 1 + len(entries)
        for stream, info, last in ends:
            before = _last_id(info)
            if before is not None:
                self.lost_acknowledged += self.acked.check(stream, before, _stream_id(last))

    async def _run(self, calls: list[Call], script: Any) -> None:
        """The script's calls in order, in one round trip. A server without the script answers
        every call NOSCRIPT and has run none of them: it is sent the script and the calls again.
        If only some calls were refused (the scripts flushed between two of them), the others
        ran, and sending the refused ones again alone could put their entries after later ones
        of the same stream: the whole batch is retried instead (at-least-once, as any retry)."""
        assert self._client is not None
        for attempt in range(2):
            pipe = self._client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results = await pipe.execute(raise_on_error=False)
            missing = [r for r in results if isinstance(r, rex.NoScriptError)]
            if missing:
                await self._client.script_load(script.script)  # same hash: the text's SHA-1
                if len(missing) == len(results) and attempt == 0:
                    continue
                raise RetryableSinkError(f"redis sink {self.id!r}: the server lost its scripts mid-batch")
            for r in results:
                if isinstance(r, Exception):
                    raise r
            for (keys, _), (_, before, after) in zip(calls, results, strict=True):
                if before:  # '' when the ACL hides the stream's last ID
                    self.lost_acknowledged += self.acked.check(keys[0], _stream_id(before), _stream_id(after))
            return


def _watermark_of(e: Event) -> tuple[str, tuple[int, ...]]:
    """The lane of ``e``'s watermark, and its order within it. A source with a total order has
    one lane, ``""`` (the watermark ``<stream>:df:watermark``). A partitioned one (a Kafka
    topic) has one per partition, ordered by offset (``<stream>:df:watermark:<topic>:<partition>``):
    partitions are read interleaved and their records' positions do not sort against each
    other's, so one watermark dropped every record behind the one another partition had moved."""
    found = lane_of(e.checkpoint)
    return ("", e.order) if found is None else found


def _last_id(info: Any) -> tuple[int, int] | None:
    """A stream's last ID from ``XINFO STREAM``'s answer: ``0-0`` for a stream that does not exist,
    ``None`` (not known) when the command was refused."""
    if isinstance(info, dict):
        found = info.get("last-generated-id")
        return None if found is None else _stream_id(found)
    if isinstance(info, rex.ResponseError) and "no such key" in str(info).lower():
        return 0, 0
    return None


def _stream_id(raw: bytes | str) -> tuple[int, int]:
    """A stream ID (``ms-seq``) as a pair that sorts as Redis does."""
    ms, _, seq = (raw.decode() if isinstance(raw, bytes) else raw).partition("-")
    return int(ms), int(seq or 0)
