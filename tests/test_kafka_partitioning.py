"""Keyed records land in the partition Kafka's Java clients would choose for their key.

Debezium, Kafka Connect, Kafka Streams and every Java producer partition a keyed record by
``murmur2(key) & 0x7fffffff % partitions``. librdkafka's default partitioner hashes with CRC32
instead, so a row's changes written by deltaforge to a topic Debezium filled before (a migration)
would land in another partition than the row's earlier changes: per-key order across the two,
and log compaction, which keeps a key's last value per partition, would both break. So would a
Kafka Streams join against a topic produced by a Java client.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import orjson
import pytest
from confluent_kafka import Producer

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.kafka_offsets import read_position
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.kit import SyntheticSource
from tests.servers.tansu import Tansu
from tests.test_kafka_sink import consume, kafka_doc, run_to

_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (clients/src/main/java/org/apache/kafka/common/utils/Utils.java),
    as a signed 32-bit int: the oracle the test compares the broker's partitions with."""
    mask = 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & mask
        k ^= k >> 24
        k = (k * _M) & mask
        h = ((h * _M) & mask) ^ k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & mask
    h ^= h >> 13
    h = (h * _M) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """Java's default partitioner for a keyed record (``Utils.toPositive(murmur2(key)) % n``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # Kafka's own vectors (UtilsTest.testMurmur2)
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_the_oracle_is_kafkas_murmur2(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent_random`` (its default): CRC32 of the key, what deltaforge used before."""
    return zlib.crc32(key) % partitions


@pytest.mark.parametrize(
    ("exactly_once", "partitioner", "expected"),
    [
        (False, None, java_partition),
        (True, None, java_partition),
        (False, "consistent_random", crc32_partition),  # the old placement, when asked for
    ],
)
async def test_each_keyed_record_lands_in_the_partition_javas_clients_choose_for_its_key(
    tansu: Tansu, exactly_once: bool, partitioner: str | None, expected: Callable[[bytes, int], int]
) -> None:
    n, partitions = 1_000, 7
    tansu.create_topic("cdc.t", partitions=partitions)
    settings = {"producer": {"partitioner": partitioner}} if partitioner else {}
    cfg = parse_pipeline(kafka_doc(tansu.bootstrap, exactly_once=exactly_once, **settings), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=200))
    await run_to(runner, n)
    got = consume(tansu.bootstrap, "cdc.t", n)
    keys = {key for _, key, _, _ in got}
    assert len(got) == n and len(keys) == 97  # the synthetic rows' 97 ids, each its own key
    misplaced = [(key, part) for part, key, _, _ in got if part != expected(key, partitions)]
    assert misplaced == []
    assert len({part for part, _, _, _ in got}) == partitions  # 97 keys spread over every partition


@pytest.mark.parametrize(("older", "newer"), [(0, 2), (2, 0)])
def test_a_position_record_found_in_two_partitions_is_read_back_from_the_newer(
    tansu: Tansu, older: int, newer: int
) -> None:
    """An offsets topic written before the partitioner changed holds a sink's position records in
    another partition than those written after: the newer one is where the sink left the source,
    whichever partition is read last."""
    tansu.create_topic("offsets", partitions=3)
    key = b"kp/k"
    p = Producer({"bootstrap.servers": tansu.bootstrap, "log_level": 3})
    for partition, seq, ts in ((older, 10, 1_700_000_000_000), (newer, 20, 1_700_000_600_000)):
        value = orjson.dumps({"position": {"seq": seq}, "order": [seq]})
        p.produce("offsets", value, key, partition, timestamp=ts)
    assert p.flush(10) == 0
    assert read_position({"bootstrap.servers": tansu.bootstrap}, "offsets", key, 10) == {"seq": 20}
