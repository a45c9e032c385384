"""A connection that cannot be made says why, in its error's own words and, for a name that does
not resolve, with the host looked up: the PostgreSQL sink said ``cannot connect: gaierror``, the
NATS sink ``cannot connect: NoServersError``, the PostgreSQL source ``gaierror: [Errno -2] Name or
service not known``, and a misspelt host in a DSN could only be guessed at. Real drivers: a name
under ``.invalid`` (RFC 6761: never resolves) and a port nobody listens on."""

from __future__ import annotations

import asyncio

import pytest

from deltaforge.config import parse_pipeline
from deltaforge.pipeline import delivery
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks import kafka_metadata
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError, SinkError
from deltaforge.sinks.kafka import KafkaSink
from deltaforge.sinks.nats import NatsSink
from deltaforge.sinks.postgres import PostgresSink
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.postgres.config import PostgresSourceConfig
from deltaforge.sources.postgres.source import PostgresSource
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import SyntheticSource, make_event, sink_pipeline
from tests.serve_proc import free_port
from tests.servers.postgres import Postgres

NOWHERE = "db-nowhere.invalid"


def postgres_sink(host: str, port: int, user: str = "cdc") -> PostgresSink:
    config = {"id": "p", "dsn": f"postgresql://{user}:s3cret@{host}:{port}/shop", "table": "t"}
    return PostgresSink(parse_pipeline(sink_pipeline("pg", "postgres", config), env={}).sinks[0])


async def test_the_postgres_sink_names_the_host_it_could_not_look_up() -> None:
    with pytest.raises(RetryableSinkError) as raised:
        await postgres_sink(NOWHERE, 5432).open()
    said = str(raised.value)
    assert said.startswith("postgres sink 'p': cannot connect: gaierror: [Errno ")
    assert said.endswith(f"(looking up {NOWHERE!r})") and "s3cret" not in said


async def test_the_postgres_sink_says_a_connection_was_refused_in_the_drivers_words() -> None:
    port = free_port()
    with pytest.raises(RetryableSinkError) as raised:
        await postgres_sink("127.0.0.1", port).open()
    said = str(raised.value)
    assert said.startswith("postgres sink 'p': cannot connect: ") and str(port) in said, said


async def test_the_nats_sink_says_why_it_found_no_server() -> None:
    config = {"id": "n", "url": f"nats://{NOWHERE}:4222", "subject": "cdc", "stream": "CDC"}
    sink = NatsSink(parse_pipeline(sink_pipeline("n", "nats", config), env={}).sinks[0])
    with pytest.raises(RetryableSinkError) as raised:
        await sink.open()
    said = str(raised.value)
    assert said.startswith("nats sink 'n': cannot connect: NoServersError: ")
    assert "(gaierror: [Errno " in said, said


async def test_the_postgres_source_names_the_host_it_could_not_look_up() -> None:
    cfg = PostgresSourceConfig.model_validate({"id": "pg", "dsn": f"postgresql://cdc:s3cret@{NOWHERE}/shop"})
    source = PostgresSource(cfg)
    try:
        with pytest.raises(SourceUnavailable) as raised:
            await source.open(None)
    finally:
        await source.close()
    said = str(raised.value)
    assert said.startswith("postgres source 'pg': gaierror: [Errno ")
    assert said.endswith(f"(looking up {NOWHERE!r})") and "s3cret" not in said


@pytest.mark.parametrize("exactly_once", [False, True], ids=["default", "exactly_once"])
@pytest.mark.parametrize(
    ("broker", "heard"),
    [(f"{NOWHERE}:9092", f"Failed to resolve '{NOWHERE}:9092'"), ("127.0.0.1:{port}", "Connection refused")],
    ids=["no such host", "refused"],
)
async def test_a_kafka_batch_that_timed_out_says_what_librdkafka_last_reported(
    broker: str, heard: str, exactly_once: bool
) -> None:
    """A batch to a broker that cannot be reached fails when its time runs out, and that error
    (``_MSG_TIMED_OUT``, ``not acknowledged in time``) said only that; librdkafka's reports of
    why (``error_cb``) went to the log alone."""
    config = {"id": "k", "brokers": broker.format(port=free_port()), "topic": "t", "timeout_s": 2,
              "exactly_once": exactly_once}  # fmt: skip
    sink = KafkaSink(parse_pipeline(sink_pipeline("kp", "kafka", config), env={}).sinks[0])
    try:
        with pytest.raises(SinkError) as raised:
            await sink.open()
            await sink.deliver([make_event(1)])
    finally:
        await sink.close()
    said = str(raised.value)
    assert "; librdkafka last said: _" in said and heard in said, said


async def test_a_kafka_delivery_unanswered_says_in_health_what_librdkafka_last_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch waits inside librdkafka while its broker refuses connections, up to ``timeout_s``
    (a minute by default). ``/health`` listed the sink after ``UNANSWERED_S`` as ``delivery
    unanswered for 30 s (still trying)`` and no more: why was in the log alone until the
    batch's own error. It now says what librdkafka last reported: at once when librdkafka
    reaches no broker, and again with the watch's own reason."""
    monkeypatch.setattr(delivery, "UNANSWERED_S", 1.0)
    # A new topic's metadata is asked first, up to LEARN_S (5 s, under UNANSWERED_S's 30), and
    # reports are served only by the flush after it.
    monkeypatch.setattr(kafka_metadata, "LEARN_S", 0.2)
    config = {"id": "k", "brokers": f"127.0.0.1:{free_port()}", "topic": "t", "timeout_s": 20}
    cfg = parse_pipeline(sink_pipeline("kp", "kafka", config), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(10))
    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: "sink:k" in runner.ctx.availability.view(), what="the sink listed")
        said = runner.ctx.availability.view()["sink:k"]["last_error"]
        assert said.startswith("delivery waiting: no server reachable (still trying; librdkafka last said: _")
        assert "Connection refused" in said, said

        def watched() -> str:
            return runner.ctx.availability.view()["sink:k"]["last_error"]

        await wait_until(lambda: watched().startswith("delivery unanswered"), what="the watch's reason")
        assert watched().startswith("delivery unanswered for 1 s (still trying; librdkafka last said: _")
        assert "Connection refused" in watched(), watched()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_postgres_sink_refused_by_the_server_says_what_the_server_said(postgres: Postgres) -> None:
    """A role the server does not know: no retry helps (the pipeline stops), and the error was
    the exception's class alone, ``InvalidAuthorizationSpecificationError``."""
    sink = postgres_sink("127.0.0.1", postgres.port, user="nobody")
    with pytest.raises(NonRetryableSinkError) as raised:
        await sink.open()
    said = str(raised.value)
    assert said == "postgres sink 'p': InvalidAuthorizationSpecificationError: role \"nobody\" does not exist"
