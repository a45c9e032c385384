"""NATS JetStream sink against a real private nats-server."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError
from deltaforge.sinks.nats import NatsSink
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import PacedSource, SyntheticSource, losses_named, make_event, sink_pipeline
from tests.servers.nats import Nats, NatsCluster, PlainNats, stream_leader
from tests.servers.proxy import TcpProxy
from tests.sink_crash import crash_and_recover, outage_and_recover, silenced_and_recover


def nats_doc(url: str, **sink: Any) -> dict[str, Any]:
    config = {"id": "n", "url": url, "subject": "cdc.${source.table}", "stream": "CDC", **sink}
    return sink_pipeline("n", "nats", config)


async def consume(url: str, subject: str, stream: str = "CDC") -> list[dict[str, Any]]:
    """Everything in the stream for ``subject``, read with a pull consumer."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info(stream)
    total = info.state.messages
    sub = await js.pull_subscribe(subject, durable=f"check{random.randrange(10**9)}", stream=stream)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(out) < total:
        try:
            msgs = await sub.fetch(1000, timeout=2)
        except nats.errors.TimeoutError:
            break
        except nats.js.errors.ServiceUnavailableError:  # a cluster still electing the consumer's leader
            if time.monotonic() > deadline:
                raise
            continue
        for m in msgs:
            doc = orjson.loads(m.data)
            doc["_msg_id"] = m.headers.get("Nats-Msg-Id") if m.headers else None
            out.append(doc)
            await m.ack()
    await nc.close()
    return out


async def test_hundred_thousand_events_complete_in_order(nats_server: Nats) -> None:
    n = 100_000
    cfg = parse_pipeline(nats_doc(nats_server.url()), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=2000))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=120, what="all committed")
    await runner.drain()
    await task
    got = await consume(nats_server.url(), "cdc.t")
    assert [int(d["event_id"]) for d in got] == list(range(1, n + 1))
    assert got[0]["_msg_id"] == got[0]["idempotency_key"]


async def test_replay_within_window_is_deduplicated_by_the_server(nats_server: Nats) -> None:
    cfg = parse_pipeline(nats_doc(nats_server.url()), env={})
    sink = NatsSink(cfg.sinks[0])
    await sink.open()
    batch = [make_event(i) for i in range(1, 51)]
    await sink.deliver(batch)
    await sink.deliver(batch)
    await sink.close()
    assert sink.duplicates == 50
    assert [int(d["event_id"]) for d in await consume(nats_server.url(), "cdc.t")] == list(range(1, 51))


async def test_a_stream_that_can_lose_or_store_twice_is_named_once_per_stream(nats_server: Nats) -> None:
    """An operator's stream held in memory loses checkpointed messages in a restart, and one that
    forgets message ids sooner than the sink assumes stores a late replay twice: each is a warning,
    once, whether the sink is given the stream or finds it by subject."""
    nc = await nats.connect(nats_server.url())
    await nc.jetstream().add_stream(
        name="MEM", subjects=["mem.>"], storage=nats.js.api.StorageType.MEMORY, duplicate_window=5
    )
    await nc.close()

    async def risks_of(**settings: Any) -> list[str]:
        sink = NatsSink(parse_pipeline(nats_doc(nats_server.url(), **settings), env={}).sinks[0])
        with capture_logs() as logs:
            await sink.open()
            await sink.deliver([make_event(1)])
            await sink.deliver([make_event(2)])
        await sink.close()
        said = [e for e in logs if e["event"] == "sink_durability"]
        assert all(e["sink"] == "n" and e["log_level"] == "warning" for e in said)
        return [e["risk"] for e in said]

    assert await risks_of() == []  # the stream the sink made: file storage, its own window
    for settings in ({"stream": "MEM", "subject": "mem.${source.table}"},
                     {"stream": None, "subject": "mem.${source.table}"}):  # fmt: skip
        risks = await risks_of(**settings)
        assert len(risks) == 2, settings
        assert risks[0].startswith("stream 'MEM' keeps its messages in memory: a restart of its server loses")
        assert risks[1].startswith("stream 'MEM' drops a repeated Nats-Msg-Id only within 5 s")
        assert "less than the sink's duplicate_window_s (120 s)" in risks[1]
    assert await risks_of(stream=None, subject="mem.${source.table}", duplicate_window_s=5) == risks[:1]


async def test_no_stream_on_subject_is_non_retryable_with_sink_id(nats_server: Nats) -> None:
    cfg = parse_pipeline(
        nats_doc(nats_server.url(), subject="nowhere.${source.table}", create_stream=False), env={}
    )
    sink = NatsSink(cfg.sinks[0])
    await sink.open()
    with pytest.raises(NonRetryableSinkError, match=r"nats sink 'n': no stream listens"):
        await sink.deliver([make_event(1)])
    await sink.close()


async def test_the_sinks_own_stream_deleted_under_it_is_made_again_and_the_loss_named(
    nats_server: Nats,
) -> None:
    """The stream the sink makes at open, deleted while it runs: made again at the next attempt
    (as a restart of the pipeline would), not a halt; what the deleted stream held is named lost.
    An operator's stream of that name that does not bind the subject still halts: making it
    again cannot help."""
    cfg = parse_pipeline(nats_doc(nats_server.url(), stream="GONE", subject="gone.${source.table}"), env={})
    sink = NatsSink(cfg.sinks[0])
    assert await losses_named(sink, 1) == []
    nc = await nats.connect(nats_server.url())
    await nc.jetstream().delete_stream("GONE")
    [said] = await losses_named(sink, 6)
    assert (said["where"], said["acknowledged"], said["now_ends_at"]) == ("GONE", "5", "0")
    got = await consume(nats_server.url(), "gone.>", stream="GONE")
    assert [d["after"]["seq"] for d in got] == [6, 7, 8, 9, 10]
    assert sink.lost_acknowledged == 1

    await nc.jetstream().delete_stream("GONE")
    await nc.jetstream().add_stream(name="GONE", subjects=["elsewhere.>"])
    await nc.close()
    with pytest.raises(NonRetryableSinkError, match=r"no stream listens on the subject 'gone\.t'"):
        await sink.deliver([make_event(11)])
    await sink.close()


async def test_a_server_without_jetstream_is_non_retryable_and_named() -> None:
    with PlainNats() as server:
        sink = NatsSink(parse_pipeline(nats_doc(server.url(), create_stream=False), env={}).sinks[0])
        await sink.open()
        with pytest.raises(
            NonRetryableSinkError, match=r"nats sink 'n': the server at 127.0.0.1:\d+ does not run JetStream"
        ):
            await sink.deliver([make_event(1)])
        await sink.close()


async def test_a_stream_the_server_cannot_create_is_non_retryable_with_its_reason(nats_server: Nats) -> None:
    sink = NatsSink(parse_pipeline(nats_doc(nats_server.url(), stream_replicas=3), env={}).sinks[0])
    with pytest.raises(NonRetryableSinkError, match=r"nats sink 'n': cannot create stream: .*replicas"):
        await sink.open()
    assert sink._nc is None  # closed, not left connected


async def test_a_cluster_stream_without_a_leader_is_retryable(nats_cluster: NatsCluster) -> None:
    """Publishes a stream's leader would answer get "no responders" while the cluster elects a new
    one (seconds): retryable, not the non-retryable "no stream listens" of a missing stream."""
    cfg = parse_pipeline(nats_doc(nats_cluster.urls(), stream_replicas=3, ack_timeout_s=2), env={})
    sink = NatsSink(cfg.sinks[0])
    await sink.open()
    # the R3 stream open() just made elects its first leader in its own time
    first = await _deliver_until_it_lands(sink, make_event(1))
    leader = await stream_leader(nats_cluster.nodes[0].url(), "CDC")
    nats_cluster.kill(leader)
    with pytest.raises(RetryableSinkError) as failed:
        await sink.deliver([make_event(2)])
    reasons = {str(failed.value), *first, *await _deliver_until_it_lands(sink, make_event(2))}
    await sink.close()
    assert not [r for r in reasons if "no stream listens" in r], reasons
    nats_cluster.node(leader).start()  # the reader needs a cluster at peace
    await stream_leader(nats_cluster.nodes[0].url(), "CDC")
    assert [int(d["event_id"]) for d in await consume(nats_cluster.nodes[0].url(), "cdc.t")] == [1, 2]


async def _deliver_until_it_lands(sink: NatsSink, event: Event) -> set[str]:
    """What the delivery worker does: again, after a backoff, until it lands; the reasons met."""
    reasons: set[str] = set()
    deadline = time.monotonic() + 60
    while True:
        try:
            await sink.deliver([event])
            return reasons
        except RetryableSinkError as exc:
            reasons.add(str(exc))
            assert time.monotonic() < deadline, f"the stream never answered: {reasons}"
            await sink.close()
            await asyncio.sleep(0.2)


async def test_a_stream_leader_lost_under_load_is_waited_for_and_nothing_is_lost(
    nats_cluster: NatsCluster,
) -> None:
    n = 8000
    cfg = parse_pipeline(nats_doc(nats_cluster.urls(), stream_replicas=3, ack_timeout_s=2), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=PacedSource(n, chunk=20, delay=0.02))
    task = asyncio.create_task(runner.run())
    stats = runner.ctx.stats
    await wait_until(lambda: stats.events_committed > 1000, timeout=60, what="some delivered")
    leader = await stream_leader(nats_cluster.nodes[0].url(), "CDC")
    nats_cluster.kill(leader)
    await wait_until(lambda: stats.sinks["n"].errors > 0, timeout=30, what="the lost leader noticed")
    await wait_until(lambda: stats.events_committed >= n, timeout=120, what="recovered")
    await runner.drain()
    await task
    assert runner.failure is None
    assert stats.sinks["n"].errors_by_kind.get("non_retryable", 0) == 0
    nats_cluster.node(leader).start()  # the reader needs a cluster at peace
    await stream_leader(nats_cluster.nodes[0].url(), "CDC")
    got = [int(d["event_id"]) for d in await consume(nats_cluster.nodes[0].url(), "cdc.t")]
    assert got == list(range(1, n + 1))  # nothing lost; replays deduplicated


async def test_outage_recovers_without_loss(nats_server: Nats) -> None:
    n = 10_000
    store = MemoryCheckpointStore()
    cfg = parse_pipeline(nats_doc(nats_server.url(), ack_timeout_s=1), env={})

    runner = PipelineRunner(cfg, store=store, source=PacedSource(n, chunk=200))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed > 1000, what="some delivered")
    nats_server.kill()
    failures = runner.ctx.stats.commit_failures
    await wait_until(lambda: runner.ctx.stats.commit_failures > failures, timeout=30, what="backing off")
    nats_server.start()
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=60, what="recovered")
    await runner.drain()
    await task
    ids = [int(d["event_id"]) for d in await consume(nats_server.url(), "cdc.t")]
    assert ids == list(range(1, n + 1))  # nothing lost, and the replay was deduplicated


@pytest.mark.slow
def test_sigkill_leaves_no_duplicates_within_the_window(nats_server: Nats, tmp_path: Path) -> None:
    sink = {
        "type": "nats",
        "config": {"id": "n", "url": "${NATS}", "subject": "cdc.${source.table}", "stream": "CDC"},
    }
    rows = crash_and_recover(tmp_path, sink, {"NATS": nats_server.url()}, kills=6, seed=8)
    got = [int(d["source"]["change_id"]) for d in asyncio.run(consume(nats_server.url(), "cdc.orders"))]
    assert len(got) == len(set(got)), "a change was stored twice within the duplicate window"
    assert got == [int(r[0]) for r in rows]


@pytest.mark.slow
@pytest.mark.outage_minute
def test_server_stopped_for_a_minute_is_waited_for_and_nothing_is_lost(
    nats_server: Nats, tmp_path: Path
) -> None:
    sink = {
        "type": "nats",
        "config": {"id": "n", "url": "${NATS}", "subject": "out.${source.table}", "stream": "OUTAGE",
                   "stream_subjects": "out.>", "ack_timeout_s": 2},
    }  # fmt: skip
    rows = outage_and_recover(
        tmp_path, sink, {"NATS": nats_server.url()}, nats_server.kill, nats_server.start
    )
    got = [
        int(d["source"]["change_id"]) for d in asyncio.run(consume(nats_server.url(), "out.orders", "OUTAGE"))
    ]
    assert len(got) == len(set(got)), "a change was stored twice within the duplicate window"
    assert got == [int(r[0]) for r in rows]  # every change, in order, none lost


def test_a_connection_gone_silent_is_given_up_and_the_stream_written_over_a_new_one(
    nats_server: Nats, tmp_path: Path
) -> None:
    """The server's host vanished, or a NAT forgot the connection: nothing answers, nothing
    closes. The acks' timeout gives the connection up, saying what it waited for, and the
    batch goes again over a new one."""
    sink = {
        "type": "nats",
        "config": {"id": "n", "url": "${NATS}", "subject": "out.${source.table}", "stream": "SILENT",
                   "stream_subjects": "out.>", "ack_timeout_s": 2},
    }  # fmt: skip
    with TcpProxy(nats_server.port) as proxy:
        rows, said = silenced_and_recover(
            tmp_path, sink, {"NATS": f"nats://127.0.0.1:{proxy.port}"}, proxy.freeze
        )
    assert "no acknowledgement for 2 s (ack_timeout_s)" in said, said
    got = [
        int(d["source"]["change_id"]) for d in asyncio.run(consume(nats_server.url(), "out.orders", "SILENT"))
    ]
    assert got == [int(r[0]) for r in rows]  # every change, in order, none lost


async def test_a_stream_that_lost_acknowledged_messages_is_named_once_per_loss() -> None:
    """An operator's stream held in memory loses every message in a restart of its server, and
    deltaforge will not send them again: the next batch's first sequence shows the stream ending
    before what it acknowledged, and the sink says so, once. Another publisher and repeated
    message ids (acknowledged as duplicates, with their first copy's sequence) are not a loss."""
    with Nats() as server:
        nc = await nats.connect(server.url())
        await nc.jetstream().add_stream(
            name="MEM", subjects=["mem.>"], storage=nats.js.api.StorageType.MEMORY
        )
        cfg = parse_pipeline(nats_doc(server.url(), stream="MEM", subject="mem.${source.table}"), env={})
        sink = NatsSink(cfg.sinks[0])

        assert await losses_named(sink, 1) == []
        await nc.jetstream().publish("mem.other", b"{}")
        assert await losses_named(sink, 6) == []
        assert await losses_named(sink, 1) == [] and sink.duplicates == 5  # a replay: duplicates
        await nc.close()
        server.kill(signal.SIGKILL)
        server.start()  # same port and store
        nc = await nats.connect(server.url())
        assert await nc.jetstream().streams_info() == []  # a memory stream goes with its server
        await nc.jetstream().add_stream(
            name="MEM", subjects=["mem.>"], storage=nats.js.api.StorageType.MEMORY
        )
        await nc.close()
        [said] = await losses_named(sink, 11)
        assert (said["log_level"], said["sink"], said["where"]) == ("error", "n", "MEM")
        assert (said["acknowledged"], said["now_ends_at"]) == ("11", "0")
        assert await losses_named(sink, 16) == []  # said once: the stream goes on from its new end
        assert sink.lost_acknowledged == 1
        await sink.close()


@pytest.mark.parametrize(
    "region, problem",
    [("east coast", "holds whitespace"), ("", "has an empty token"), ("*", "has a wildcard token"),
     ("a.", "has an empty token")],
)  # fmt: skip
async def test_a_subject_nats_does_not_allow_is_poison_before_anything_of_the_batch_is_sent(
    nats_server: Nats, region: str, problem: str
) -> None:
    """A template that renders a subject NATS does not allow (``cdc.${after.region}``): that event
    is poison (``routing``) before any message of its batch is published, on every attempt. Left
    to the client and server, whitespace failed the batch with an error the sink did not know
    (after the messages before it were sent), an empty token had no stream answer (retried for
    ever as a stream without a leader), and a wildcard was stored as a subject no consumer's
    filter names."""
    from deltaforge.events import with_images
    from deltaforge.sinks.base import PoisonEvent

    sink = NatsSink(
        parse_pipeline(nats_doc(nats_server.url(), subject="cdc.${after.region}"), env={}).sinks[0]
    )
    await sink.open()
    good = [with_images(make_event(i), "c", None, {"id": i, "region": "t"}) for i in (1, 2)]
    bad = with_images(make_event(3), "c", None, {"id": 3, "region": region})
    for _ in range(2):
        with pytest.raises(PoisonEvent) as info:
            await sink.deliver([*good, bad])
        assert info.value.kind == "routing"
        assert f"subject {f'cdc.{region}'!r} {problem}" in str(info.value)
    await sink.close()
    nc = await nats.connect(nats_server.url())
    assert (await nc.jetstream().stream_info("CDC")).state.messages == 0
    await nc.close()


def test_a_fixed_subject_nats_does_not_allow_is_refused_naming_the_field() -> None:
    from deltaforge.config import ConfigError

    with pytest.raises(ConfigError, match=r"subject.*'cdc orders' holds whitespace"):
        parse_pipeline(nats_doc("nats://127.0.0.1:4222", subject="cdc orders"), env={})


async def test_two_pipelines_of_like_databases_into_one_stream_each_keep_every_change(
    nats_server: Nats, tmp_path: Path
) -> None:
    """Two embedded databases of one name (``app.db`` of two devices), a pipeline each, one
    stream. A change's idempotency key (the ``Nats-Msg-Id``) is tenant, table, transaction and
    change id; the tenant defaulted to ``default`` for every pipeline, so the second database's
    changes had the first one's keys, and JetStream dropped them as duplicates. The tenant now
    defaults to the pipeline's name."""
    from tests.test_turso_source import written

    runners = []
    for device in ("phone", "tablet"):
        db = tmp_path / device / "app.db"
        db.parent.mkdir()
        written(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
                *(f"INSERT INTO t VALUES ({i}, '{device}')" for i in range(1, 4))).close()  # fmt: skip
        doc = nats_doc(nats_server.url(), id=f"n_{device}")
        doc["metadata"] = {"name": device}
        doc["spec"]["source"] = {"type": "turso", "config": {"id": device, "path": str(db)}}
        runners.append(PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore()))
    tasks = [asyncio.create_task(r.run()) for r in runners]
    await wait_until(lambda: all(r.ctx.stats.events_committed >= 3 for r in runners), timeout=30, what="both")
    for runner, task in zip(runners, tasks, strict=True):
        await runner.drain()
        await task
    got = await consume(nats_server.url(), "cdc.t")
    assert sorted((d["after"]["v"], d["after"]["id"]) for d in got if d["after"]) == [
        (device, i) for device in ("phone", "tablet") for i in range(1, 4)
    ]


async def test_a_message_too_large_for_the_server_or_its_stream_is_a_poison_event(nats_server: Nats) -> None:
    """Larger than the server's ``max_payload``: nats-py raised its own error, which the delivery
    worker took for a crash; restarted on the same batch until the pipeline failed, without the
    event's coordinates or the dead-letter queue. Larger than the stream's ``max_msg_size``: the
    server refused it, and the batch was retried for ever. Both are now the event's fault: a
    poison event, found by bisection, to the DLQ or a halt naming it."""
    from deltaforge.sinks.base import PoisonEvent

    nc = await nats.connect(nats_server.url())
    await nc.jetstream().add_stream(name="SMALL", subjects=["small.>"], max_msg_size=4096)
    await nc.close()
    for doc, payload in ((nats_doc(nats_server.url()), 2_000_000),
                         (nats_doc(nats_server.url(), subject="small.${source.table}", stream="SMALL"), 8_000)):  # fmt: skip
        sink = NatsSink(parse_pipeline(doc, env={}).sinks[0])
        await sink.open()
        with pytest.raises(PoisonEvent, match=r"too large|exceeds"):
            await sink.deliver([make_event(1), make_event(2, payload="x" * payload)])
        await sink.deliver([make_event(3)])  # the next batch goes on the same connection
        await sink.close()
