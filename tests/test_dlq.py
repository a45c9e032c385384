"""The dead-letter queue in-process (issue 16, acceptance 2): poison events isolated from their
batch, kept with why, bounded by each overflow policy, listed, acked, purged and replayed over
REST; with the journal off, a poison event halts the pipeline naming it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from deltaforge.api import build_app
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import PoisonEvent
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from deltaforge.state.sqlite_store import SqliteCheckpointStore
from tests.helpers import file_size_limit, restarts, wait_until
from tests.kit import ScriptedSink, SyntheticSource, config, make_event, sink_doc
from tests.test_metrics import scrape, value


def refusing(poison: set[int]) -> Callable[[int, list[Event]], None]:
    """A sink script that refuses any batch holding one of ``poison`` (by seq), as a target
    refuses a whole transaction for one bad row."""

    def script(call: int, events: list[Event]) -> None:
        bad = [e.order[0] for e in events if e.order[0] in poison]
        if bad:
            raise PoisonEvent(f"row {bad[0]} violates a constraint", "rejected")

    return script


def journal(max_entries: int = 100, policy: str = "drop_oldest", enabled: bool = True) -> dict[str, Any]:
    return {"enabled": enabled, "dlq": {"max_entries": max_entries, "overflow_policy": policy}}


async def run(sink: ScriptedSink, n: int, store: MemoryCheckpointStore, **cfg: Any) -> PipelineRunner:
    runner = PipelineRunner(config(sinks=[sink_doc(sink.id)], batch={"max_events": 500}, **cfg),
                            store=store, source=SyntheticSource(n, chunk=500), sinks={sink.id: sink})  # fmt: skip
    runner.task = asyncio.create_task(runner.run())  # type: ignore[attr-defined]
    return runner


async def finish(runner: PipelineRunner) -> None:
    await runner.drain()
    await asyncio.wait_for(runner.task, 30)  # type: ignore[attr-defined]


@pytest.fixture()
async def api() -> AsyncIterator[Callable[[PipelineRunner], httpx.AsyncClient]]:
    clients: list[httpx.AsyncClient] = []

    def client(runner: PipelineRunner) -> httpx.AsyncClient:
        app = build_app({"t": runner})
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df")
        clients.append(c)
        return c

    yield client
    for c in clients:
        await c.aclose()


async def test_poison_events_go_to_the_dlq_and_the_rest_arrive_in_order(api: Any) -> None:
    n, poison = 10_000, {4_321, 4_322, 7_000}
    sink, store = ScriptedSink("a", script=refusing(poison)), MemoryCheckpointStore()
    runner = await run(sink, n, store, journal=journal())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, what="every batch committed")
    client = api(runner)
    entries = (await client.get("/pipelines/t/journal/dlq")).json()
    await finish(runner)
    assert sink.received == [s for s in range(1, n + 1) if s not in poison]  # in order, poison left out
    assert [e["position"]["seq"] for e in entries] == sorted(poison)
    first = entries[0]
    assert first["sink"] == "a" and first["kind"] == "rejected" and "violates a constraint" in first["error"]
    assert first["event_id"] and first["idempotency_key"].endswith(first["event_id"])
    assert first["event"]["after"]["seq"] == 4_321 and first["attempts"] == 1 and "payload" not in first
    assert (await store.get(sink_key("src", "a"))) == {"seq": n}  # the checkpoint moved past them
    assert runner.ctx.stats.sinks["a"].dead_letters == 3
    samples = await scrape({"t": runner})
    assert value(samples, "deltaforge_dlq_entries", pipeline="t") == 3
    assert value(samples, "deltaforge_dlq_events_total", pipeline="t", outcome="added") == 3
    assert value(samples, "deltaforge_sink_dead_letters_total", pipeline="t", sink="a") == 3


@pytest.mark.parametrize("policy", ["drop_oldest", "reject"])
async def test_a_full_dlq_drops_the_oldest_or_rejects_the_new_entry(policy: str) -> None:
    n, poison = 3_000, {100, 1_100, 2_100}
    sink, store = ScriptedSink("a", script=refusing(poison)), MemoryCheckpointStore()
    runner = await run(sink, n, store, journal=journal(max_entries=2, policy=policy))
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, what="every batch committed")
    await finish(runner)
    kept = [e["position"]["seq"] for e in await store.dead_letters.select("t")]
    dlq = runner.ctx.dlq
    assert dlq is not None
    if policy == "drop_oldest":
        assert kept == [1_100, 2_100] and dlq.dropped == 1 and dlq.rejected == 0
    else:
        assert kept == [100, 1_100] and dlq.rejected == 1 and dlq.dropped == 0
    assert len(sink.received) == n - 3


async def test_a_full_dlq_under_block_holds_the_sink_degraded_until_an_ack(api: Any) -> None:
    n, poison = 3_000, {100, 1_100, 2_100}
    sink, store = ScriptedSink("a", script=refusing(poison)), MemoryCheckpointStore()
    runner = await run(sink, n, store, journal=journal(max_entries=2, policy="block"))
    client = api(runner)

    async def blocked() -> bool:
        return (await client.get("/health")).json()["status"] == "degraded"

    await wait_until(lambda: "dlq:a" in runner.ctx.availability.view().get("t", {}) or runner.degraded,
                     what="blocked on the full DLQ")  # fmt: skip
    assert await blocked()
    held = runner.ctx.stats.events_committed
    assert held < n and 2_100 not in sink.received
    assert (await client.get("/pipelines/t/journal/dlq/count")).json() == {"count": 2}
    acked = await client.post("/pipelines/t/journal/dlq/ack", json={"up_to": 1})
    assert acked.json() == {"acked": 1}
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, what="going on after the ack")
    assert not await blocked()
    await finish(runner)
    assert [e["position"]["seq"] for e in await store.dead_letters.select("t")] == [1_100, 2_100]


async def test_replay_delivers_a_fixed_entry_once_and_acks_it(api: Any) -> None:
    n, poison = 2_000, {700, 1_500}
    sink, store = ScriptedSink("a", script=refusing(poison)), MemoryCheckpointStore()
    runner = await run(sink, n, store, journal=journal())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, what="every batch committed")
    client = api(runner)
    [first, second] = (await client.get("/pipelines/t/journal/dlq")).json()
    refused = await client.post("/pipelines/t/journal/dlq/replay", json={"seqs": [first["seq"]]})
    assert refused.status_code == 409 and refused.json()["code"] == "replay_failed"
    assert "violates a constraint" in refused.json()["message"]
    sink.script = None  # the operator fixed the target
    done = await client.post("/pipelines/t/journal/dlq/replay", json={"seqs": [first["seq"]]})
    assert done.json() == {"replayed": 1}
    again = await client.post("/pipelines/t/journal/dlq/replay", json={"seqs": [first["seq"]]})
    assert again.json() == {"replayed": 0}  # acked: gone
    assert sink.received.count(700) == 1 and 1_500 not in sink.received
    assert [e["seq"] for e in (await client.get("/pipelines/t/journal/dlq")).json()] == [second["seq"]]
    purged = await client.delete("/pipelines/t/journal/dlq")
    assert purged.json() == {"purged": 1}
    assert (await client.get("/pipelines/t/journal/dlq/count")).json() == {"count": 0}
    bad = await client.post("/pipelines/t/journal/dlq/ack", json={"up_to": "soon"})
    assert bad.status_code == 400 and bad.json()["code"] == "bad_request"
    await finish(runner)


async def test_a_dead_letter_met_on_a_full_disk_is_kept_once_there_is_room(tmp_path: Path) -> None:
    """The DLQ is in the state store: on a full disk its write waits (degraded, ``state_store``
    listed), then keeps the entry once, and nothing restarts; before, the error crashed the
    delivery worker and restarted the pipeline until the restart limit stopped it."""
    n, reached, gate = 3_000, asyncio.Event(), asyncio.Event()
    refuse = refusing({2_100})

    async def script(call: int, events: list[Event]) -> None:
        if any(e.order[0] == 2_100 for e in events) and not gate.is_set():
            reached.set()
            await gate.wait()  # the disk fills up while this batch is out
        refuse(call, events)

    sink = ScriptedSink("a", script=script)
    storage = {"type": "sqlite", "path": str(tmp_path / "state.db")}
    runner = PipelineRunner(config(sinks=[sink_doc("a")], batch={"max_events": 500}, journal=journal(), storage=storage),
                            source=SyntheticSource(n, chunk=500), sinks={"a": sink})  # fmt: skip
    task = asyncio.create_task(runner.run())
    outages = runner.ctx.availability
    await asyncio.wait_for(reached.wait(), 30)
    with file_size_limit(0):
        gate.set()
        await wait_until(lambda: "state_store" in outages.view(), what="the store listed as down")
        await wait_until(lambda: outages.view()["state_store"]["attempts"] > 5, what="writes tried again")
        assert runner.state == "running"
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, what="every batch committed")
    kept = [e["position"]["seq"] for e in await runner.store.dead_letters.select("t")]
    await runner.drain()
    await asyncio.wait_for(task, 30)
    assert kept == [2_100] and restarts(runner.snapshot()) == 0
    assert sink.received == [i for i in range(1, n + 1) if i != 2_100]


async def test_without_the_journal_a_poison_event_halts_naming_it() -> None:
    sink, store = ScriptedSink("a", script=refusing({1_234})), MemoryCheckpointStore()
    fast = {"max_restarts": 2, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}}
    runner = await run(sink, 3_000, store, supervision=fast)
    await asyncio.wait_for(runner.task, 30)  # type: ignore[attr-defined]
    assert runner.state == "failed"
    assert (
        runner.failure is not None and "poison event" in runner.failure and "{'seq': 1234}" in runner.failure
    )
    assert "spec.journal.enabled" in runner.failure
    assert max(sink.received) < 1_234 or 1_234 not in sink.received


@pytest.mark.parametrize("policy", ["reject", "drop_oldest"])
async def test_sinks_putting_dead_letters_at_once_keep_the_bound(tmp_path: Path, policy: str) -> None:
    """Two sinks' workers put dead letters at the same moment: the bound is checked and the entry
    added as one step, so ``max_entries`` holds (each saw room and both added, before)."""
    store = SqliteCheckpointStore(tmp_path / "state.db")
    await store.open()
    runner = PipelineRunner(config(journal=journal(max_entries=2, policy=policy)), store=store,
                            source=SyntheticSource(1))  # fmt: skip
    dlq = runner.ctx.dlq
    assert dlq is not None
    poison = PoisonEvent("row violates a constraint", "rejected")
    kept = await asyncio.gather(*(dlq.put(f"s{i}", make_event(i), poison, 1) for i in range(6)))
    assert await store.dead_letters.count("t") == 2
    if policy == "reject":
        assert sum(seq is not None for seq in kept) == 2 and dlq.rejected == 4
    await store.close()


async def test_a_replay_sent_twice_at_once_delivers_the_entry_once(api: Any) -> None:
    """Both requests took the same entries and both delivered them before either acked them;
    now the second finds them gone."""
    sink, store = ScriptedSink("a", script=refusing({700})), MemoryCheckpointStore()
    runner = await run(sink, 1_000, store, journal=journal())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 1_000, what="every batch committed")
    client = api(runner)
    [entry] = (await client.get("/pipelines/t/journal/dlq")).json()
    sink.script = None  # the target is fixed
    replays = await asyncio.gather(
        *(client.post("/pipelines/t/journal/dlq/replay", json={"seqs": [entry["seq"]]}) for _ in range(2))
    )
    assert sorted(r.json()["replayed"] for r in replays) == [0, 1]
    assert sink.received.count(700) == 1
    await finish(runner)


async def test_a_misspelt_filter_is_refused_not_taken_for_every_entry(api: Any) -> None:
    """``DELETE …/dlq?snk=a`` purged every sink's dead letters (the unknown filter ignored), and an
    ack with ``"snk"`` acked every sink's up to its seq: dead letters are changes kept for an
    operator's decision, lost to a typo."""
    sink, store = ScriptedSink("a", script=refusing({100, 200})), MemoryCheckpointStore()
    runner = await run(sink, 1_000, store, journal=journal())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 1_000, what="every batch committed")
    client = api(runner)
    entries = (await client.get("/pipelines/t/journal/dlq")).json()
    assert len(entries) == 2
    purge = await client.delete("/pipelines/t/journal/dlq", params={"snk": "a"})
    assert purge.status_code == 400
    assert purge.json()["message"] == "query: unknown 'snk'; expected any of sink"
    ack = await client.post("/pipelines/t/journal/dlq/ack", json={"up_to": entries[-1]["seq"], "snk": "a"})
    assert ack.status_code == 400 and "unknown 'snk'" in ack.json()["message"]
    listed = await client.get("/pipelines/t/journal/dlq", params={"limt": "1"})
    assert listed.status_code == 400
    assert (await client.get("/pipelines/t/journal/dlq/count")).json() == {"count": 2}
    await finish(runner)
