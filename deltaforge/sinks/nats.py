"""NATS JetStream sink: Nats-Msg-Id = idempotency key, every ack awaited per batch.

At-least-once with server-side dedup: JetStream drops a message whose
``Nats-Msg-Id`` it has seen within the stream's ``duplicate_window``, so a
replay after a crash inside that window adds nothing. The batch is published
with ``publish_async`` and is delivered only when every PubAck came back.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated, Any

import nats
from nats import errors as nerr
from nats.js import errors as jserr
from pydantic import AfterValidator, Field

from deltaforge.configmodel import (
    Bool,
    PositiveInt,
    PositiveNumber,
    SinkConfig,
    SinkSettings,
    Text,
    matching,
    server_addresses,
)
from deltaforge.connectfail import why
from deltaforge.envelopes import encoder
from deltaforge.events import Event
from deltaforge.position import Position
from deltaforge.sinks import durability
from deltaforge.sinks.acknowledged import AckedEnds
from deltaforge.sinks.base import (
    NonRetryableSinkError,
    PoisonEvent,
    RetryableSinkError,
    Sink,
    SinkError,
    servers_of,
)
from deltaforge.sinks.names import IllegalName, checked_renderer, fixed_name_check
from deltaforge.sinks.nats_js import JetStream
from deltaforge.sinks.templates import Template

NatsUrl = Annotated[
    Text,
    matching(
        r"^(nats|tls)://[^,\s]+(,(nats|tls)://[^,\s]+)*$",
        "expected nats://host:port, or several comma-separated (the servers of a cluster)",
    ),
    server_addresses("expected nats://host:port", several=True),
]


LOOKED_UP = 8
"""Subjects whose streams are looked up when the sink is not given its stream."""


def subject_problem(name: str) -> str | None:
    """Why ``name`` is not a subject to publish to (NATS: tokens separated by ``.``, none empty,
    no whitespace, no wildcard token), or None. nats-py refuses whitespace itself, but only as
    the batch is published; the server takes a subject with an empty token and no stream answers
    it; a wildcard token is stored as a subject no consumer's filter names."""
    tokens = name.split(".")
    if any(c.isspace() for c in name):
        problem = "holds whitespace"
    elif not all(tokens):
        problem = "has an empty token"
    elif "*" in tokens or ">" in tokens:
        problem = "has a wildcard token"
    else:
        return None
    return f"{name!r} {problem}: not a NATS subject to publish to (tokens separated by '.', none empty, no whitespace, no '*' or '>' token)"


def _refuse_illegal(sink_id: str, name: str) -> None:
    problem = subject_problem(name)
    if problem:
        raise IllegalName(f"nats sink {sink_id!r}: subject {problem}")


SubjectTemplate = Annotated[Template, AfterValidator(fixed_name_check(subject_problem))]
"""A subject template; a subject without placeholders must already be one to publish to."""


_TOO_LARGE_FOR_STREAM = 10054
"""JetStream's error code for a message larger than its stream's ``max_msg_size``."""


class NatsSinkConfig(SinkSettings):
    """NATS JetStream: one message per event, deduplicated by ``Nats-Msg-Id``."""

    url: NatsUrl = Field(
        description="nats://host:port; for a cluster, several comma-separated: any that answers will do."
    )
    subject: SubjectTemplate = Field(description="Subject per event, e.g. cdc.${source.table}.")
    stream: Text | None = Field(None, description="The JetStream stream that holds the subjects.")
    stream_subjects: Text | None = Field(
        None, description="Subjects the created stream binds (default: subject)."
    )
    create_stream: Bool | None = Field(
        None, description="Create the stream when missing (default: when stream is set)."
    )
    duplicate_window_s: PositiveNumber = Field(120.0, description="The created stream's dedup window.")
    stream_replicas: PositiveInt = Field(
        1, description="The created stream's replicas (a cluster: 3 survives the loss of one server)."
    )
    ack_timeout_s: PositiveNumber = Field(10.0, description="How long to wait for a batch's acks.")


class NatsSink(Sink[NatsSinkConfig]):
    """Publishes each event to a JetStream subject named by a template (``cdc.${source.table}``)."""

    def __init__(self, config: SinkConfig[NatsSinkConfig]) -> None:
        super().__init__(config)
        cfg = self.settings
        self.servers = cfg.url.split(",")
        self.subject_of = checked_renderer(cfg.subject, partial(_refuse_illegal, self.id))
        self.stream = cfg.stream
        self.create_stream = cfg.create_stream if cfg.create_stream is not None else bool(cfg.stream)
        self.duplicate_window = cfg.duplicate_window_s
        self.ack_timeout = cfg.ack_timeout_s
        self.encode = encoder(config.envelope)
        self._nc: Any = None
        self._js: Any = None
        self.duplicates = 0
        self.target = servers_of(self.servers, 4222)
        self.acked = self.acked_ends = AckedEnds[int](self.id, "NatsSink", "stream sequence")
        self.last_error: str | None = None
        self._streams_read: set[str] = set()
        self._looked_up = False

    async def open(self) -> None:
        self.last_error = None  # what _quiet hears of this connect: NoServersError says no more
        try:
            self._nc = await nats.connect(
                self.servers,
                connect_timeout=min(5.0, self.ack_timeout),
                # A lost connection fails the batch and the retry reconnects. Not allow_reconnect=False:
                # with it (or max_reconnect_attempts=0) nats-py 2.16's first connect to a down server
                # never returns; one quick attempt (at each server given) makes it raise NoServersError.
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                error_cb=self._quiet,  # the default prints tracebacks; failures surface as SinkErrors
            )
        except (nerr.NoServersError, OSError, TimeoutError) as exc:
            said = f" ({self.last_error})" if self.last_error else ""
            raise RetryableSinkError(f"nats sink {self.id!r}: cannot connect: {why(exc)}{said}") from None
        except nerr.Error as exc:
            if "authorization" in str(exc).lower():
                raise NonRetryableSinkError(f"nats sink {self.id!r}: {exc}") from None
            raise RetryableSinkError(f"nats sink {self.id!r}: {exc}") from None
        self._js = JetStream(self._nc, timeout=self.ack_timeout)  # nats.py#985: see nats_js.py
        if self.create_stream and self.stream:
            subjects = [self.settings.stream_subjects or self.settings.subject]
            subjects = [s.split("${", 1)[0] + ">" if "${" in s else s for s in subjects]
            try:
                await self._js.add_stream(
                    name=str(self.stream), subjects=subjects, duplicate_window=self.duplicate_window,
                    num_replicas=self.settings.stream_replicas,
                )  # fmt: skip
            except jserr.BadRequestError:
                pass  # exists with another config: leave it as the operator set it
            except (TimeoutError, nerr.TimeoutError, jserr.ServiceUnavailableError) as exc:
                await self.close()
                raise RetryableSinkError(
                    f"nats sink {self.id!r}: JetStream does not answer ({type(exc).__name__})"
                ) from None
            except jserr.APIError as exc:  # e.g. more replicas than servers: retrying cannot help
                await self.close()
                raise NonRetryableSinkError(f"nats sink {self.id!r}: cannot create stream: {exc}") from None
        if self.stream and self.stream not in self._streams_read:
            await self._read_stream(str(self.stream))

    async def _read_stream(self, name: str) -> None:
        """Once per stream: what its settings risk (``deltaforge/sinks/durability.py``): an operator's
        stream may hold its messages in memory, or forget message ids sooner than the sink assumes."""
        try:
            info = await self._js.stream_info(name)
        except jserr.NotFoundError:  # not made yet: a publish to it says so
            return
        except (TimeoutError, nerr.Error, OSError) as exc:
            durability.unknown(self.id, "NatsSink", f"stream {name!r}: {type(exc).__name__}: {exc}")
        else:
            cfg = info.config
            storage = getattr(cfg.storage, "value", cfg.storage) or "file"
            risks = durability.nats_risks(
                name, str(storage), cfg.num_replicas or 1, cfg.duplicate_window or 0.0, self.duplicate_window
            )
            durability.report(self.id, "NatsSink", risks)
        self._streams_read.add(name)

    async def _read_streams_of(self, subjects: set[str]) -> None:
        """Without a ``stream`` setting, after the first batch delivered: the streams holding its
        subjects (a few: a subject per row would cost a round trip each), each read once."""
        self._looked_up = True
        for subject in sorted(subjects)[:LOOKED_UP]:
            try:
                name = await self._js.find_stream_name_by_subject(subject)
            except (TimeoutError, nerr.Error, OSError) as exc:
                durability.unknown(self.id, "NatsSink", f"subject {subject!r}: {type(exc).__name__}: {exc}")
                return
            if name not in self._streams_read:
                await self._read_stream(name)

    async def _quiet(self, exc: Exception) -> None:
        self.last_error = why(exc)

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            try:
                # close() flushes; on a dead connection that can wait forever
                await asyncio.wait_for(nc.close(), timeout=2)
            except (TimeoutError, nerr.Error, OSError):
                pass

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        if self._nc is None or not self._nc.is_connected:
            await self.close()
            await self.open()
        js = self._js
        subjects = [self.subject_of(e) for e in events]
        try:
            futures = [
                await js.publish_async(subject, self.encode(e), headers={"Nats-Msg-Id": e.idempotency_key})
                for subject, e in zip(subjects, events, strict=True)
            ]
            acks = await asyncio.wait_for(asyncio.gather(*futures), self.ack_timeout)
        except (nerr.NoRespondersError, jserr.NoStreamResponseError):
            raise await self._unanswered(set(subjects)) from None
        except (
            TimeoutError,
            nerr.TimeoutError,
            nerr.ConnectionClosedError,
            nerr.StaleConnectionError,
            OSError,
        ) as exc:
            await self.close()
            why = (  # the acks' own wait: a bare TimeoutError says nothing of what was waited for
                f"no acknowledgement for {self.ack_timeout:g} s (ack_timeout_s)"
                if type(exc) is TimeoutError
                else f"{type(exc).__name__}: {exc}"
            )
            raise RetryableSinkError(f"nats sink {self.id!r}: {why}") from None
        except nerr.MaxPayloadError:
            # nats-py refuses it before sending: larger than the server's max_payload
            raise PoisonEvent(
                f"nats sink {self.id!r}: a message is too large for the server (its max_payload)", "too_large"
            ) from None
        except jserr.APIError as exc:
            if exc.err_code == _TOO_LARGE_FOR_STREAM:
                raise PoisonEvent(f"nats sink {self.id!r}: {exc}", "too_large") from None
            raise RetryableSinkError(f"nats sink {self.id!r}: {exc}") from None
        self._check_acks(acks)
        if not self.stream and not self._looked_up:
            await self._read_streams_of(set(subjects))

    def _check_acks(self, acks: list[Any]) -> None:
        """Count duplicates, and compare where each stream stood before this batch (its first new
        message's sequence, less one) with what it acknowledged before (``acknowledged.py``).
        Messages of one connection are stored in the order published; a duplicate's ack carries
        the first copy's sequence, and is left out."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for a in acks:
            if a.duplicate:
                self.duplicates += 1
            else:
                first.setdefault(a.stream, a.seq)
                last[a.stream] = a.seq
        for stream, seq in first.items():
            self.lost_acknowledged += self.acked.check(stream, seq - 1, last[stream])

    async def _gone(self, stream: str) -> bool:
        """Whether ``stream`` no longer exists (not: exists, without the subject published to)."""
        try:
            await self._js.stream_info(stream)
        except jserr.NotFoundError:
            return True
        except (TimeoutError, nerr.Error) as exc:
            raise RetryableSinkError(
                f"nats sink {self.id!r}: JetStream does not answer ({type(exc).__name__})"
            ) from None
        return False

    async def _unanswered(self, subjects: set[str]) -> SinkError:
        """Why no stream answered a publish, asked of JetStream's API: a subject no stream binds,
        or a server without JetStream (and no API answering through it), is a setting to fix
        (non-retryable); a stream that binds the subject but has no leader (a cluster electing
        one after a server was lost or stepped down: seconds), or an API that does not answer,
        is waited for; the sink's own stream, deleted, is made again."""
        if not self._nc.is_connected:
            return RetryableSinkError(f"nats sink {self.id!r}: connection lost")
        for subject in sorted(subjects):
            try:
                stream = await self._js.find_stream_name_by_subject(subject)
            except jserr.NotFoundError:
                if self.create_stream and self.stream and await self._gone(str(self.stream)):
                    # The stream this sink makes at open was deleted under it: make it again at the
                    # next attempt's open, as a restart would. What it held is lost; the first
                    # batch in the new stream says so (``_check_acks``).
                    await self.close()
                    return RetryableSinkError(
                        f"nats sink {self.id!r}: stream {self.stream!r} is gone (deleted): made again"
                    )
                return NonRetryableSinkError(
                    f"nats sink {self.id!r}: no stream listens on the subject {subject!r}"
                )
            except jserr.ServiceUnavailableError:
                # The API has no responders. nats-py keeps the server's INFO only as this field.
                if not self._nc._server_info.get("jetstream"):
                    url = self._nc.connected_url
                    return NonRetryableSinkError(
                        f"nats sink {self.id!r}: the server at {url.hostname}:{url.port} does not run JetStream"
                    )
                return RetryableSinkError(f"nats sink {self.id!r}: JetStream does not answer (no responders)")
            except (TimeoutError, nerr.Error) as exc:
                return RetryableSinkError(
                    f"nats sink {self.id!r}: JetStream does not answer ({type(exc).__name__})"
                )
        return RetryableSinkError(
            f"nats sink {self.id!r}: stream {stream!r} has no leader to answer (a cluster electing one)"
        )
