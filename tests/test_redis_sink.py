"""Redis Streams sink against a real private redis-server."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.crc import key_slot
from structlog.testing import capture_logs

from deltaforge.config import parse_pipeline
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError
from deltaforge.sinks.redis import RedisSink
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import NextRuns, PacedSource, SyntheticSource, losses_named, make_event, sink_pipeline
from tests.servers.proxy import TcpProxy
from tests.servers.redis import Redis, redis_cluster, restart
from tests.sink_crash import crash_and_recover, outage_and_recover, silenced_and_recover


def redis_doc(uri: str, exactly_once: bool = False, **batch: Any) -> dict[str, Any]:
    config = {"id": "r", "uri": uri, "stream": "cdc.${source.table}", "exactly_once": exactly_once}
    return sink_pipeline("r", "redis", config, batch or None)


def user_without(server: Redis, name: str, *refused: str) -> str:
    """A user (password ``pw``) the ACL refuses ``refused``; the server's URI as that user."""
    server.client().acl_setuser(
        name, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", *refused]
    )
    return server.uri().replace("redis://", f"redis://{name}:pw@")


def entries(server: Redis, stream: str = "cdc.t") -> list[dict[str, Any]]:
    out = []
    for _id, fields in server.client().xrange(stream):
        doc = orjson.loads(fields[b"event"])
        doc["_key"] = fields[b"idempotency_key"].decode()
        out.append(doc)
    return out


async def run_until(runner: PipelineRunner, cond: Any, timeout: float = 60) -> None:
    task = asyncio.create_task(runner.run())
    await wait_until(cond, timeout=timeout, what="pipeline progress")
    await runner.drain()
    await task


@pytest.mark.parametrize("exactly_once", [False, True])
async def test_hundred_thousand_events_complete_and_in_order(redis_server: Redis, exactly_once: bool) -> None:
    n = 100_000
    cfg = parse_pipeline(redis_doc(redis_server.uri(), exactly_once), env={})
    runner = PipelineRunner(cfg, store=MemoryCheckpointStore(), source=SyntheticSource(n, chunk=2000))
    await run_until(runner, lambda: runner.ctx.stats.events_committed >= n)
    got = entries(redis_server)
    assert [int(d["event_id"]) for d in got] == list(range(1, n + 1))  # independent XRANGE read
    assert got[0]["_key"] == got[0]["idempotency_key"] == "acme|db.t|0|1"
    assert runner.ctx.stats.sinks["r"].events == n


async def test_a_server_out_of_memory_is_not_taken_for_back_though_it_answers_ping(
    redis_server: Redis,
) -> None:
    """A lagging sink comes back when its probe answers. At ``maxmemory`` with ``noeviction``,
    Redis answers ``PING`` and refuses every write: each comeback failed its first batch and held
    the other sinks back while the source was read again (chaos ``sink_refuses_writes``). The
    probe reads ``INFO memory`` too; a user who may not ask for it is probed by ``PING`` alone."""
    admin = redis_server.client()
    sink = RedisSink(parse_pipeline(redis_doc(redis_server.uri()), env={}).sinks[0])
    await sink.open()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        assert admin.ping()
        with pytest.raises(RetryableSinkError, match=r"out of memory: used_memory [0-9]+ over maxmemory 1 with "
                           "maxmemory-policy noeviction: writes are refused"):  # fmt: skip
            await sink.reachable()
        with pytest.raises(RetryableSinkError, match=r"OOM|maxmemory"):
            await sink.deliver([make_event(1)])  # what the probe says holds
        blind = RedisSink(
            parse_pipeline(redis_doc(user_without(redis_server, "blind", "-info")), env={}).sinks[0]
        )
        await blind.open()
        await blind.reachable()  # cannot know: PING answers for it
        await blind.close()
    finally:
        admin.config_set("maxmemory", 0)
    await sink.reachable()
    await sink.deliver([make_event(1)])
    await sink.close()
    assert [int(d["event_id"]) for d in entries(redis_server)] == [1]


async def test_exactly_once_replays_are_no_ops(redis_server: Redis) -> None:
    cfg = parse_pipeline(redis_doc(redis_server.uri(), exactly_once=True), env={})
    sink = RedisSink(cfg.sinks[0])
    await sink.open()
    first = [make_event(i) for i in range(1, 11)]
    await sink.deliver(first)
    await sink.deliver(first)  # the whole batch again
    await sink.deliver([make_event(i) for i in range(6, 16)])  # overlapping replay
    await sink.close()
    assert [int(d["event_id"]) for d in entries(redis_server)] == list(range(1, 16))


async def test_two_pipelines_writing_one_stream_exactly_once_each_keep_every_change(
    redis_server: Redis,
) -> None:
    """Two sources fanned into one stream (shards of a table, say): their positions do not sort
    against each other's. One watermark per stream took both, and every change of the source
    whose positions were lower was dropped as written already. Each pipeline has its own now,
    and a replay of either still writes nothing twice."""
    doc = redis_doc(redis_server.uri(), exactly_once=True)
    doc["spec"]["sinks"][0]["config"]["stream"] = "fanin.${source.table}"
    sinks = []
    for name in ("shard_a", "shard_b"):
        sink = RedisSink(parse_pipeline(doc, env={}).sinks[0])
        sink.pipeline = name
        await sink.open()
        sinks.append(sink)
    ahead, behind = [make_event(i) for i in range(100, 111)], [make_event(i) for i in range(1, 11)]
    await sinks[0].deliver(ahead)
    await sinks[1].deliver(behind)
    await sinks[0].deliver(ahead[5:])  # replays
    await sinks[1].deliver(behind)
    for sink in sinks:
        await sink.close()
    got = [int(d["event_id"]) for d in entries(redis_server, "fanin.t")]
    assert got == [*range(100, 111), *range(1, 11)]


async def test_two_deployments_of_one_pipeline_writing_one_stream_exactly_once_each_keep_every_change(
    redis_server: Redis, tmp_path: Path
) -> None:
    """One config deployed once per shard, each deployment reading its own database: one
    pipeline name, two sources fanned into one stream. Keyed by the name alone, the watermark was
    shared, and the shard whose positions sorted lower had every change dropped as written
    already. The watermark is kept per deployment too (where its source reads), so each shard
    keeps every change; the same deployment again, its store lost, still writes nothing twice."""
    stream = f"fanin2.{tmp_path.name[-8:]}"

    async def deploy(shard: str, total: int) -> PipelineRunner:
        doc = redis_doc(redis_server.uri(), exactly_once=True)
        doc["metadata"]["name"] = "orders"
        doc["spec"]["sinks"][0]["config"]["stream"] = stream
        doc["spec"]["source"]["config"]["path"] = str(tmp_path / f"{shard}.db")  # each shard its database
        doc["spec"]["storage"] = {"type": "memory"}  # a store of its own, lost at every stop
        runner = PipelineRunner(parse_pipeline(doc, env={}), source=SyntheticSource(total))
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.ctx.stats.events_committed >= total or runner.state == "failed",
                         what=f"shard {shard} delivered")  # fmt: skip
        await runner.drain()
        await asyncio.wait_for(task, 30)
        return runner

    await deploy("eu", 30)
    await deploy("us", 10)
    await deploy("us", 10)  # again, its store lost: read again from the start, written again nowhere
    got = [int(d["event_id"]) for d in entries(redis_server, stream)]
    assert got == [*range(1, 31), *range(1, 11)]


async def test_outage_backs_off_holds_checkpoint_and_recovers(redis_server: Redis) -> None:
    n = 20_000
    store = MemoryCheckpointStore()
    cfg = parse_pipeline(redis_doc(redis_server.uri(), max_events=500, max_ms=20), env={})

    runner = PipelineRunner(cfg, store=store, source=PacedSource(n, chunk=200))
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed > 2000, what="some delivered")
    redis_server.kill()
    failures = runner.ctx.stats.commit_failures
    await wait_until(lambda: runner.ctx.stats.commit_failures > failures + 1, timeout=30, what="backing off")
    held = await store.get("src::sink::r")
    await asyncio.sleep(0.5)
    assert await store.get("src::sink::r") == held  # the checkpoint holds while the sink is down
    restart(redis_server)
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=60, what="recovered")
    await runner.drain()
    await task
    ids = [int(d["event_id"]) for d in entries(redis_server)]
    assert set(ids) == set(range(1, n + 1))  # nothing lost (retries may duplicate: at-least-once)
    assert runner.state == "stopped"


async def test_wrong_password_is_non_retryable_and_names_the_sink() -> None:
    with Redis(password="right-pw") as server:
        bad = server.uri().replace("right-pw", "wrong-pw")
        cfg = parse_pipeline(redis_doc(bad), env={})
        sink = RedisSink(cfg.sinks[0])
        with pytest.raises(NonRetryableSinkError, match=r"redis sink 'r'") as info:
            await sink.deliver([make_event(1)])
        await sink.close()
        assert "wrong-pw" not in str(info.value)


@pytest.mark.parametrize("exactly_once", [False, True])
async def test_a_redis_cluster_node_is_refused_saying_why(exactly_once: bool) -> None:
    """A Redis Cluster node answers a stream of another node's slots MOVED, and a script whose
    stream and watermark hash to two slots CROSSSLOT: both were retried for ever, the pipeline
    degraded as if the server were down. The sink speaks to one server, so a cluster is a
    setting to change, said before anything is written."""
    with redis_cluster() as (a, b):
        theirs = next(f"cdc.{i}" for i in range(1000) if key_slot(f"cdc.{i}".encode()) > 8191)  # b's
        for stream in (theirs, "cdc.t"):
            config = {"id": "r", "uri": a.uri(), "stream": stream, "exactly_once": exactly_once}
            sink = RedisSink(parse_pipeline(sink_pipeline("r", "redis", config), env={}).sinks[0])
            try:
                with pytest.raises(NonRetryableSinkError, match=r"redis sink 'r': .*Redis Cluster"):
                    await sink.deliver([make_event(1)])
            finally:
                await sink.close()
        assert a.client().dbsize() == b.client().dbsize() == 0


@pytest.mark.slow
def test_exactly_once_survives_sigkill_with_one_entry_per_change(redis_server: Redis, tmp_path: Path) -> None:
    sink = {
        "type": "redis",
        "config": {"id": "r", "uri": "${REDIS}", "stream": "cdc.${source.table}", "exactly_once": True},
    }
    rows = crash_and_recover(tmp_path, sink, {"REDIS": redis_server.uri()}, kills=6, seed=6)
    got = [int(d["source"]["change_id"]) for d in entries(redis_server, "cdc.orders")]
    assert got == sorted(got) and len(got) == len(set(got)), "a change was written twice"
    assert got == [int(r[0]) for r in rows]  # every change exactly once, in order


@pytest.mark.slow
@pytest.mark.outage_minute
def test_server_stopped_for_a_minute_is_waited_for_with_one_entry_per_change(
    redis_server: Redis, tmp_path: Path
) -> None:
    sink = {
        "type": "redis",
        "config": {"id": "r", "uri": "${REDIS}", "stream": "out.${source.table}", "exactly_once": True},
    }
    rows = outage_and_recover(
        tmp_path, sink, {"REDIS": redis_server.uri()}, redis_server.kill, redis_server.start
    )
    got = [int(d["source"]["change_id"]) for d in entries(redis_server, "out.orders")]
    assert got == [int(r[0]) for r in rows]  # every change exactly once, in order


def test_a_connection_gone_silent_is_given_up_and_the_stream_written_over_a_new_one(
    redis_server: Redis, tmp_path: Path
) -> None:
    """The server's host vanished, or a NAT forgot the connection: nothing answers, nothing
    closes. The socket's timeout gives the connection up and the batch goes again over a new
    one, each change once."""
    sink = {
        "type": "redis",
        "config": {"id": "r", "uri": "${REDIS}", "stream": "out.${source.table}", "exactly_once": True},
    }
    with TcpProxy(redis_server.port) as proxy:
        rows, said = silenced_and_recover(
            tmp_path,
            sink,
            {"REDIS": redis_server.uri().replace(f":{redis_server.port}/", f":{proxy.port}/")},
            proxy.freeze,
        )
    assert "Timeout reading" in said, said
    got = [int(d["source"]["change_id"]) for d in entries(redis_server, "out.orders")]
    assert got == [int(r[0]) for r in rows]  # every change exactly once, in order


@pytest.mark.parametrize("exactly_once", [False, True])
async def test_a_server_that_lost_the_sinks_script_is_sent_it_again(
    redis_server: Redis, exactly_once: bool
) -> None:
    cfg = parse_pipeline(redis_doc(redis_server.uri(), exactly_once), env={})
    sink = RedisSink(cfg.sinks[0])
    await sink.open()
    await sink.deliver([make_event(i) for i in range(1, 6)])
    redis_server.client().script_flush()  # what a restart does to the server's scripts
    await sink.deliver([make_event(i) for i in range(6, 2_501)])  # several script calls
    await sink.close()
    assert [int(d["event_id"]) for d in entries(redis_server)] == list(range(1, 2_501))


async def test_maxlen_trims_each_stream_and_keeps_its_newest_entries(redis_server: Redis) -> None:
    config = {"id": "r", "uri": redis_server.uri(), "stream": "cdc.${source.table}", "maxlen": 100}
    cfg = parse_pipeline(sink_pipeline("r", "redis", config), env={})
    sink = RedisSink(cfg.sinks[0])
    await sink.open()
    for start in range(1, 5_001, 500):
        await sink.deliver([make_event(i) for i in range(start, start + 500)])
    await sink.close()
    ids = [int(d["event_id"]) for d in entries(redis_server)]
    # "~": Redis trims whole nodes of the stream (100 entries each by default), never below 100.
    assert 100 <= len(ids) < 300, len(ids)
    assert ids == list(range(5_001 - len(ids), 5_001))


async def test_a_user_who_may_not_run_scripts_gets_one_xadd_per_event_and_exactly_once_stops(
    redis_server: Redis,
) -> None:
    uri = user_without(redis_server, "noscripts", "-@scripting")
    sink = RedisSink(parse_pipeline(redis_doc(uri), env={}).sinks[0])
    await sink.deliver([make_event(i) for i in range(1, 1_501)])
    await sink.deliver([make_event(i) for i in range(1_501, 1_601)])
    await sink.close()
    assert [int(d["event_id"]) for d in entries(redis_server)] == list(range(1, 1_601))

    sink = RedisSink(parse_pipeline(redis_doc(uri, exactly_once=True), env={}).sinks[0])
    with pytest.raises(NonRetryableSinkError, match=r"redis sink 'r'") as info:
        await sink.deliver([make_event(1_601)])
    await sink.close()
    assert "evalsha" in str(info.value).lower()  # the refused command is named


@pytest.mark.parametrize("mode", ["scripted", "exactly_once", "no_scripts"])
async def test_a_user_who_may_not_read_a_streams_end_still_delivers(redis_server: Redis, mode: str) -> None:
    """The check for lost entries reads each stream's last ID (``EXISTS``, ``XINFO``) in the same
    script, or before the XADDs of a user who may not run scripts; an ACL that refuses those
    leaves that check out, never the delivery."""
    refused = ["-xinfo", "-exists"] + (["-@scripting"] if mode == "no_scripts" else [])
    uri = user_without(redis_server, "noinfo", *refused)
    sink = RedisSink(parse_pipeline(redis_doc(uri, mode == "exactly_once"), env={}).sinks[0])
    with capture_logs() as logs:
        await sink.deliver([make_event(i) for i in range(1, 6)])
        await sink.deliver([make_event(i) for i in range(6, 11)])
    await sink.close()
    assert [int(d["event_id"]) for d in entries(redis_server)] == list(range(1, 11))
    said = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert said == (["redis_scripts_refused"] if mode == "no_scripts" else [])


async def test_settings_that_can_lose_acknowledged_entries_are_named_once_per_sink(
    redis_server: Redis,
) -> None:
    """A Redis that acknowledges before disk, or evicts keys, can lose checkpointed entries: each
    risk is a warning naming the setting, once, before the first batch; CONFIG refused is said."""
    admin = redis_server.client()

    async def risks_of(uri: str, first: int) -> tuple[list[str], list[dict[str, Any]]]:
        sink = RedisSink(parse_pipeline(redis_doc(uri), env={}).sinks[0])
        with capture_logs() as logs:
            await sink.deliver([make_event(first)])
            await sink.deliver([make_event(first + 1)])
        await sink.close()
        said = [e for e in logs if e["event"] == "sink_durability"]
        assert all(e["sink"] == "r" and e["log_level"] == "warning" for e in said)
        return [e["risk"] for e in said], [e for e in logs if e["event"] == "sink_durability_unknown"]

    assert await risks_of(redis_server.uri(), 1) == ([], [])  # appendonly yes, appendfsync always

    admin.config_set("appendfsync", "everysec")
    admin.config_set("maxmemory", "64mb")
    admin.config_set("maxmemory-policy", "volatile-lru")  # streams have no TTL: never evicted
    risks, _ = await risks_of(redis_server.uri(), 3)
    assert len(risks) == 1 and risks[0].startswith("appendfsync is everysec:") and "last second" in risks[0]

    admin.config_set("appendonly", "no")
    admin.config_set("maxmemory-policy", "allkeys-lru")
    risks, _ = await risks_of(redis_server.uri(), 5)
    assert len(risks) == 2
    assert (
        risks[0].startswith("appendonly is no:") and "set appendonly yes and appendfsync always" in risks[0]
    )
    assert risks[1].startswith("maxmemory-policy is allkeys-lru with maxmemory 67108864:")

    risks, unknown = await risks_of(user_without(redis_server, "noconfig", "-config"), 7)
    assert risks == [] and len(unknown) == 1 and "CONFIG GET refused" in unknown[0]["reason"]
    assert [int(d["event_id"]) for d in entries(redis_server)] == list(range(1, 9))  # nothing held up


@pytest.mark.parametrize("mode", ["scripted", "exactly_once", "no_scripts"])
async def test_a_server_that_lost_acknowledged_entries_is_named_once_per_loss(mode: str) -> None:
    """Redis restarted without its data (what its defaults do to everything since the last RDB
    save) no longer has entries it acknowledged, and deltaforge will not send them again: the
    next batch finds the stream ending before them, and says so, once. Other writers, XDEL and
    trimming never move a stream's last ID back, and are not taken for a loss. The same for a
    user who may not run scripts (one XADD per event, the stream's end read before them)."""
    with Redis() as server:

        def uri() -> str:  # its user made again after a restart that forgot it
            return user_without(server, "noscripts", "-@scripting") if mode == "no_scripts" else server.uri()

        sink = RedisSink(parse_pipeline(redis_doc(uri(), mode == "exactly_once"), env={}).sinks[0])
        admin = server.client()

        assert await losses_named(sink, 1) == []
        admin.xadd("cdc.t", {"event": "{}", "idempotency_key": "another writer"})
        last = admin.xrevrange("cdc.t", count=1)[0][0]
        admin.xdel("cdc.t", last)  # a consumer deleting what it has read
        admin.xtrim("cdc.t", maxlen=1)
        assert await losses_named(sink, 6) == []
        acknowledged = admin.xinfo_stream("cdc.t")["last-generated-id"].decode()
        server.kill(signal.SIGKILL)
        shutil.rmtree(server.dir / "appendonlydir")  # the restart finds nothing on disk
        restart(server)
        uri()
        [said] = await losses_named(sink, 11)
        assert (said["log_level"], said["sink"], said["where"]) == ("error", "r", "cdc.t")
        assert (said["acknowledged"], said["now_ends_at"]) == (acknowledged, "0-0")
        assert "snapshot the tables they came from again" in said["reason"]
        assert await losses_named(sink, 16) == []  # said once: the stream goes on from its new end
        assert sink.lost_acknowledged == 1
        assert [int(d["event_id"]) for d in entries(server)] == list(range(11, 21))
        assert sink._scripted == (mode != "no_scripts")
        await sink.close()


async def test_a_loss_while_deltaforge_was_stopped_is_named_at_the_next_run() -> None:
    """The marks a sink compares its streams' ends with are kept in the checkpoint store when its
    worker stops: Redis restarted without its data while the pipeline was stopped too (one power
    cut for both) is named at the next run's first batch, once. A run that finds everything, and
    a sink pointed at another server (a new, empty one is not a loss), say nothing."""
    runs = NextRuns()

    async def run(uri: str) -> list[dict[str, Any]]:
        """The pipeline, from its checkpoint, until 100 more changes are delivered, and stopped."""
        return await runs.losses_named(redis_doc(uri), 100)

    with Redis() as server, Redis() as elsewhere:
        assert await run(server.uri()) == []
        assert await run(server.uri()) == []
        server.kill(signal.SIGKILL)
        shutil.rmtree(server.dir / "appendonlydir")
        restart(server)
        [said] = await run(server.uri())
        assert (said["sink"], said["where"], said["now_ends_at"]) == ("r", "cdc.t", "0-0")
        assert await run(server.uri()) == []  # said once
        assert await run(elsewhere.uri()) == []
        assert [int(d["event_id"]) for d in entries(elsewhere)] == list(range(401, 501))


@pytest.mark.parametrize("mode", ["scripted", "exactly_once", "no_scripts"])
async def test_a_stream_name_taken_by_a_key_of_another_type_is_non_retryable(
    redis_server: Redis, mode: str
) -> None:
    """A stream template that names a key holding a string (or a list, a hash...) gets WRONGTYPE
    on every write: retrying cannot fix it, yet it was retried for ever, the pipeline degraded.
    It is now non-retryable, naming what to do, whichever way the sink writes."""
    redis_server.client().set("taken.t", "an application's value")
    uri = (
        user_without(redis_server, f"wrongtype{mode}", "-@scripting")
        if mode == "no_scripts"
        else redis_server.uri()
    )
    config = {
        "id": "r",
        "uri": uri,
        "stream": "taken.${source.table}",
        "exactly_once": mode == "exactly_once",
    }
    sink = RedisSink(parse_pipeline(sink_pipeline("r", "redis", config), env={}).sinks[0])
    with pytest.raises(
        NonRetryableSinkError, match=r"redis sink 'r': a key named as one of its streams holds another"
    ):
        await sink.deliver([make_event(1)])
    await sink.close()
    assert redis_server.client().get("taken.t") == b"an application's value"
