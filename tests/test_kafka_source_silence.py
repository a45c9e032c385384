"""The Kafka source when its broker's connection goes silent for good (the broker's host vanished,
a NAT forgot the connection): nothing answers, nothing closes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from deltaforge.events import Event
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.kafka import source as kafka_source
from deltaforge.sources.kafka.config import KafkaSourceConfig
from deltaforge.sources.kafka.source import KafkaSource
from tests.serve_proc import free_port
from tests.servers.proxy import TcpProxy
from tests.servers.tansu import Tansu
from tests.test_kafka_source import produce


@pytest.fixture()
def proxied_tansu() -> Iterator[tuple[Tansu, TcpProxy]]:
    """A Tansu that tells its clients the proxy's address, and the proxy."""
    port = free_port()
    with Tansu(advertise=port) as server, TcpProxy(server.port, port=port) as proxy:
        yield server, proxy


async def test_a_broker_gone_silent_is_an_outage_within_the_probes_bound(
    proxied_tansu: tuple[Tansu, TcpProxy],
) -> None:
    """An idle source probes its broker (``topics()``) every ``IDLE_PROBE_S``, and aiokafka
    waits its own request timeout (40 s) for an answer: a connection gone silent was noticed
    only after that. The probe is bounded at ``PROBE_S`` (10 s); then the source is unavailable,
    and opened again (over new connections) it reads on from its checkpoint."""
    tansu, proxy = proxied_tansu
    tansu.create_topic("t", partitions=1)
    produce(tansu.bootstrap, [("t", 0, b"k", b"v1")])
    cfg = KafkaSourceConfig.model_validate(
        {"id": "k", "brokers": f"127.0.0.1:{proxy.port}", "topics": ["t"], "group_id": "g", "format": "raw"}
    )
    src = KafkaSource(cfg)
    await src.open(None)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    got: list[Event] = []
    while not got:
        assert loop.time() < deadline, "the first record not read in 60 s"
        got = await src.read()
    proxy.freeze()
    frozen = loop.time()
    with pytest.raises(
        SourceUnavailable, match=rf"no answer for {kafka_source.PROBE_S:g} s to a metadata request"
    ):
        while loop.time() - frozen < 60:
            await src.read()
    await src.close()
    produce(tansu.bootstrap, [("t", 0, b"k", b"v2")])
    await src.open(got[-1].checkpoint)  # over new connections, which the proxy passes
    deadline = loop.time() + 60
    again: list[Event] = []
    while not again:
        assert loop.time() < deadline, "nothing read in 60 s over a new connection"
        again = await src.read()
    assert [e.checkpoint.to_doc() for e in again] != [e.checkpoint.to_doc() for e in got]
    assert len(again) == 1
    await src.close()
