"""A call that fails in a worker thread lets go of what its frames held when it fails, not at
the next cyclic collection (``actors/threads.py``). ``serve`` collects seldom
(``deltaforge/gctune.py``): a Kafka producer given up in an outage kept its librdkafka threads,
pipes and sockets, reconnecting to the broker, one more after each outage, until then (chaos
``outage_cycles`` saw eight). The collector is off in these tests, as good as ``serve``'s."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from actors import Begun, BlockingRunner, in_thread
from deltaforge.config import parse_pipeline
from deltaforge.sinks.base import RetryableSinkError
from deltaforge.sinks.kafka import KafkaSink
from deltaforge.sinks.kafka_ends import READ_EVERY_S, PartitionEnds
from tests.helpers import librdkafka_clients
from tests.kit import make_event
from tests.serve_proc import free_port
from tests.servers.proxy import TcpProxy
from tests.servers.tansu import Tansu
from tests.test_kafka_sink import kafka_doc


@pytest.fixture(autouse=True)
def no_cyclic_collection() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Held:
    """Something a failing call's frame holds (a connection, a producer)."""


def failing(kept: list[weakref.ref[Held]]) -> None:
    held = Held()
    kept.append(weakref.ref(held))
    raise RuntimeError(f"failed holding {held!r}")


async def test_a_call_failing_in_a_worker_thread_lets_go_of_what_its_frames_held() -> None:
    kept: list[weakref.ref[Held]] = []
    with pytest.raises(RuntimeError, match="failed holding") as failure:
        await BlockingRunner(1).run(failing, kept)
    assert kept[0]() is None, "held by the failed call's frame after it failed"
    assert "failing" in str(failure.traceback[-1].name)  # the traceback still says where


def made_from(arg: Held) -> Held:
    return Held()


@pytest.mark.parametrize("call", [BlockingRunner(1).run, in_thread], ids=["BlockingRunner", "in_thread"])
async def test_a_finished_call_keeps_neither_its_arguments_nor_its_result(
    call: Callable[..., Awaitable[Held]],
) -> None:
    """anyio's idle worker thread keeps its last call's arguments and result until its next call:
    a producer handed over to be discarded, a batch delivered, lived on in one."""
    arg = Held()
    result = await call(made_from, arg)
    kept = [weakref.ref(arg), weakref.ref(result)]
    del arg, result
    assert [k() for k in kept] == [None, None]


def test_every_blocking_call_of_deltaforge_goes_through_actors_threads() -> None:
    """Not ``anyio.to_thread.run_sync`` itself: its idle worker would keep what the call held
    (a file sink's last batch; a failed call's frames)."""
    root = Path(__file__).resolve().parent.parent
    direct = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("deltaforge", "supervision")
        for path in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "to_thread.run_sync" in line
    ]
    assert direct == []


async def test_a_begun_call_that_failed_lets_go_of_what_its_frames_held() -> None:
    kept: list[weakref.ref[Held]] = []
    begun = Begun(failing, kept)
    with pytest.raises(RuntimeError, match="failed holding"):
        await begun.result()
    assert kept[0]() is None, "held by the failed call's frame after it failed"


def rdkafka_clients() -> int:
    return librdkafka_clients(os.getpid())


async def test_a_kafka_producer_given_up_in_an_outage_goes_with_its_threads() -> None:
    """Two outages: after each failed batch the producer given up has stopped (its thread is
    gone), and after each recovery the sink runs as many librdkafka clients as after the last
    (the first recovery adds the reader of partition ends that checks for lost records)."""
    proxy_port = free_port()
    with Tansu(advertise=proxy_port) as broker, TcpProxy(broker.port, proxy_port) as proxy:
        broker.create_topic("cdc.t")
        bootstrap = f"127.0.0.1:{proxy_port}"
        sink = KafkaSink(parse_pipeline(kafka_doc(bootstrap, timeout_s=30), env={}).sinks[0])
        try:
            await sink.deliver([make_event(i) for i in range(100)])
            after: list[int] = []
            for outage in range(2):
                before = rdkafka_clients()
                sink.timeout = 1.0  # the batch's flush gives up after 1 s
                proxy.down()
                events = [make_event(i) for i in range(100 * (outage + 1), 100 * (outage + 2))]
                with pytest.raises(RetryableSinkError):
                    await sink.deliver(events)
                assert sink._producer is None  # given up: the retry gets a new one
                assert rdkafka_clients() == before - 1, "the producer given up still runs"
                proxy.up()
                sink.timeout = 30.0
                await sink.deliver(events)
                after.append(rdkafka_clients())
            assert after[1] == after[0]
        finally:
            await sink.close()


def test_the_partition_ends_client_given_up_after_a_failed_reading_goes_with_its_threads() -> None:
    """The reader of partition ends (lost acknowledged records) starts a new client after a
    reading that failed. The old one's frames held it beside the futures of its answers, and the
    future of an answer that failed holds the exception whose traceback holds those frames: a
    cycle, the client's threads and sockets running on until the collector came."""
    proxy_port = free_port()
    with Tansu(advertise=proxy_port) as broker, TcpProxy(broker.port, proxy_port) as proxy:
        broker.create_topic("cdc.t")
        ends = PartitionEnds("k", timeout_s=1.0)
        ends.conf = {"bootstrap.servers": f"127.0.0.1:{proxy_port}"}
        ends.produced_to({"cdc.t"})
        assert ends.check() == 0 and not ends.disturbed  # read: its client runs, partitions known
        before = rdkafka_clients()
        ends.read_at -= READ_EVERY_S  # due again: the ends only, the partitions known
        proxy.down()  # the partitions known: only the ends are asked, and fail
        assert ends.check() == 0 and ends.disturbed  # not read: tried again before the next batch
        assert ends._admin is None  # the next reading on a new client
        assert rdkafka_clients() == before - 1, "the client given up still runs"
