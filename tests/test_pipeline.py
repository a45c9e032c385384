"""The pipeline's actors in-process: commit policy, per-sink checkpoints, supervision, backpressure."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import anyio
import httpx
import psutil
import pytest
from structlog.testing import capture_logs

from deltaforge.api import build_app
from deltaforge.config import PipelineConfig
from deltaforge.events import Event
from deltaforge.pipeline import delivery
from deltaforge.pipeline.messages import Rewind
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sinks.base import NonRetryableSinkError, RetryableSinkError
from deltaforge.state.checkpoints import MemoryCheckpointStore, sink_key
from supervision import FakeClock
from tests.helpers import first_occurrences, wait_until
from tests.kit import PacedSource, ScriptedSink, SyntheticSource, config, sink_doc

N = 500


def fails(exc: type[Exception] = RetryableSinkError) -> Any:
    def script(call: int, events: list[Event]) -> None:
        raise exc(f"down (call {call})")

    return script


async def start(
    cfg: PipelineConfig, sinks: list[ScriptedSink], source: SyntheticSource, store: MemoryCheckpointStore
) -> tuple[PipelineRunner, asyncio.Task[None]]:
    runner = PipelineRunner(cfg, store=store, sinks={s.id: s for s in sinks}, source=source)
    task = asyncio.create_task(runner.run())
    return runner, task


async def stop(runner: PipelineRunner, task: asyncio.Task[None], drain_timeout: float = 5) -> None:
    await runner.drain(timeout=drain_timeout)
    await asyncio.wait_for(task, 10)


async def checkpoint(store: MemoryCheckpointStore, sid: str) -> int | None:
    cp = await store.get(sink_key("src", sid))
    return None if cp is None else int(cp["seq"])


first_seen = first_occurrences


async def test_a_stop_asked_before_the_pipeline_got_going_is_not_forgotten() -> None:
    """A SIGTERM during start-up: drain() before run() has started the tree stops it all the same."""
    sink = ScriptedSink("a")
    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(),
                            source=SyntheticSource(N), sinks={"a": sink})  # fmt: skip
    task = asyncio.create_task(runner.run())
    await runner.drain()
    await asyncio.wait_for(task, 30)  # a bound for a hang, not a wait: run() returns at once
    assert runner.state == "stopped" and not sink.received


async def test_failed_required_sink_makes_no_checkpoint_advance() -> None:
    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=fails())
    b = ScriptedSink("b", required=False)
    runner, task = await start(
        config(sinks=[sink_doc("a"), sink_doc("b", required=False)]), [a, b], SyntheticSource(N), store
    )
    await wait_until(lambda: runner.ctx.stats.commit_failures >= 3, what="retries of the first batch")
    assert await checkpoint(store, "a") is None
    assert await checkpoint(store, "b") is None  # b has it, but the policy was not met
    assert b.received  # b did receive the batch: delivered is not committed
    assert runner.ctx.stats.batches_committed == 0
    await stop(runner, task, drain_timeout=0.5)  # a stuck sink cannot drain
    assert await checkpoint(store, "b") is None


async def test_required_policy_commits_without_failed_optional_sink_which_lags() -> None:
    store = MemoryCheckpointStore()
    a, b = ScriptedSink("a"), ScriptedSink("b", required=False, script=fails())
    runner, task = await start(
        config(sinks=[sink_doc("a"), sink_doc("b", required=False)]), [a, b], SyntheticSource(N), store
    )
    await wait_until(lambda: len(a.received) == N, what="a has everything")
    await stop(runner, task)
    assert await checkpoint(store, "a") == N
    assert await checkpoint(store, "b") is None
    assert runner.ctx.stats.sinks["b"].lagging
    # A lagging sink is not asked for each later batch: only once per reading (3 attempts), when
    # a probe said it was back and the source was read again for it.
    assert b.calls <= 3 * runner.ctx.epoch


async def test_an_optional_sink_whose_library_raises_what_no_one_classified_never_stops_the_others() -> None:
    """An optional sink raising an error of its library that is no SinkError (the stdout sink's
    BrokenPipeError once the reader of standard output had gone), on every batch and every probe
    asking whether it is back: it lags, each error logged with its traceback, while the required
    sink takes everything. Before, each error crashed the sink's worker (a restart counted
    against the pipeline's restart intensity) and a probe of the worker, raising too or meeting
    it down between two incarnations, crashed the coordinator: the pipeline restarted whole
    until it failed."""
    probes = 0

    class Crashing(ScriptedSink):
        async def reachable(self) -> None:
            nonlocal probes
            probes += 1
            raise RuntimeError("the library's own error")

    clock = FakeClock()  # the probes' backoff without waiting for it; the intensity's window too
    a, b = ScriptedSink("a"), Crashing("b", required=False, script=fails(RuntimeError))
    store = MemoryCheckpointStore()
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)], batch={"max_events": 50, "max_ms": 5},
                 supervision={"max_restarts": 3, "within_seconds": 60})  # fmt: skip
    runner = PipelineRunner(cfg, store=store, sinks={"a": a, "b": b}, source=SyntheticSource(N, chunk=50),
                            clock=clock, rng=random.Random(3))  # fmt: skip
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: runner.state == "failed" or (len(a.received) == N and probes >= 10),
                         what="a has it all and b was probed 10 times, or the pipeline failed")  # fmt: skip
        assert runner.state == "running", runner.failure
        snap = runner.snapshot()
        await stop(runner, task)
    assert a.received == list(range(1, N + 1))
    assert await checkpoint(store, "a") == N and await checkpoint(store, "b") is None
    assert runner.ctx.stats.sinks["b"].lagging
    for actor in ("DeliveryCoordinator", "DeliveryWorker[b]", "SourceReader"):
        node = snap.find(actor)
        assert node is not None and node.restarts == 0, actor
    crashed = [e for e in logs if e["event"] == "sink_raised"]
    assert len(crashed) >= 10 and all(e["exc_info"] is True and e["sink"] == "b" for e in crashed)


async def test_an_optional_sink_whose_probe_hangs_never_holds_the_others_back() -> None:
    """A lagging optional sink is probed to see whether it is back; a probe that does not answer
    (a server half-open, a connect that waits out its timeout) took the coordinator with it,
    which waited for the answer (up to 120 s) before it handed any sink its next batch: the
    required sink delivered nothing meanwhile, probe after probe. Probes now run beside
    delivery."""
    probed = asyncio.Event()

    class Hanging(ScriptedSink):
        async def reachable(self) -> None:
            probed.set()
            await asyncio.Event().wait()  # never answers

    a, b = ScriptedSink("a"), Hanging("b", required=False, script=fails())
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)], batch={"max_events": 50, "max_ms": 5})
    source = PacedSource(1_000_000, chunk=50, delay=0.01)  # more than the test takes: a never catches up
    runner, task = await start(cfg, [a, b], source, MemoryCheckpointStore())
    await asyncio.wait_for(probed.wait(), 30)  # b lags, and its probe hangs from now on
    held = len(a.received)
    await wait_until(
        lambda: len(a.received) >= held + 500, timeout=30, what="a delivering while b's probe hangs"
    )
    assert runner.ctx.stats.sinks["b"].lagging
    runner.stop_now()
    await asyncio.wait_for(task, 30)
    assert a.received == list(range(1, len(a.received) + 1))


async def test_a_lagging_optional_sink_that_comes_back_catches_up_in_the_same_run() -> None:
    store = MemoryCheckpointStore()
    down = True

    def flaky(call: int, events: list[Event]) -> None:
        if down:
            raise RetryableSinkError("b is down")

    class DownUntilUp(ScriptedSink):
        # A probe that says "reachable" while deliveries still fail would let b rejoin, fail
        # again and be briefly not lagging: the probe and the deliveries agree, as a server's do.
        async def reachable(self) -> None:
            flaky(0, [])

    a, b = ScriptedSink("a"), DownUntilUp("b", required=False, script=flaky)
    source = SyntheticSource(N, chunk=50)
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)], batch={"max_events": 50, "max_ms": 5})
    runner, task = await start(cfg, [a, b], source, store)
    await wait_until(lambda: len(a.received) == N, what="a has everything while b is down")
    assert runner.ctx.stats.sinks["b"].lagging and not b.received
    down = False
    await wait_until(lambda: len(b.received) >= N, timeout=30, what="b caught up without a restart")
    await wait_until(lambda: not runner.ctx.stats.sinks["b"].lagging, what="b no longer lagging")
    assert b.received == list(range(1, N + 1))  # all of it, in order, nothing twice
    assert a.received == list(range(1, N + 1))  # a skipped what the second reading repeated
    assert source.opened_from[0] == 1 and source.opened_from[-1] == 1  # read again from b's checkpoint
    await stop(runner, task)
    assert await checkpoint(store, "b") == N


class SlowSource(SyntheticSource):
    """Reads 50,000 changes a second, again as at first (a database's backlog, not a burst)."""

    async def read(self) -> list[Event]:
        events = await super().read()
        await asyncio.sleep(len(events) / 50_000)
        return events


async def test_an_optional_sink_that_answers_probes_but_refuses_writes_never_starves_the_others() -> None:
    """A sink whose probe answers while its writes fail (Redis out of memory answers PING; a
    PostgreSQL target with a full disk answers SELECT 1) rejoins, fails its first batch, is
    probed, rejoins again: each time the source is read again from its checkpoint, and the
    other sinks skip what they hold until the reading is past it. Once that re-reading took
    longer than the next comeback, the required sink got nothing new, for good (here it never
    got the 40,000). Now the next comeback waits four times as long as the last one's
    re-reading took to get back where the others were (rereading.py)."""

    def refuses(call: int, events: list[Event]) -> None:
        if call > 1:
            raise RetryableSinkError("OOM command not allowed when used memory > 'maxmemory'")

    total = 40_000
    a, b = ScriptedSink("a"), ScriptedSink("b", required=False, script=refuses)
    source = SlowSource(total, chunk=500)
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)], batch={"max_events": 500, "max_ms": 5})
    runner, task = await start(cfg, [a, b], source, MemoryCheckpointStore())
    await wait_until(lambda: len(source.opened_from) >= 3, timeout=30, what="b back and read for twice")
    await wait_until(lambda: len(first_seen(a.received)) == total, timeout=60, what="a given everything")
    assert first_seen(a.received) == list(range(1, total + 1))
    runner.stop_now()
    await asyncio.wait_for(task, 30)


async def test_all_policy_blocks_on_optional_sink() -> None:
    store = MemoryCheckpointStore()
    a, b = ScriptedSink("a"), ScriptedSink("b", required=False, script=fails())
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)], commit_policy={"mode": "all"})
    runner, task = await start(cfg, [a, b], SyntheticSource(N), store)
    await wait_until(lambda: runner.ctx.stats.commit_failures >= 2, what="policy unmet")
    assert runner.ctx.stats.batches_committed == 0
    await stop(runner, task, drain_timeout=0.5)  # a stuck sink cannot drain
    assert await checkpoint(store, "a") is None


async def test_quorum_policy_commits_with_enough_sinks() -> None:
    store = MemoryCheckpointStore()
    a, b, c = ScriptedSink("a"), ScriptedSink("b"), ScriptedSink("c", script=fails())
    cfg = config(
        sinks=[sink_doc("a"), sink_doc("b"), sink_doc("c")], commit_policy={"mode": "quorum", "quorum": 2}
    )
    runner, task = await start(cfg, [a, b, c], SyntheticSource(N), store)
    await wait_until(lambda: len(a.received) == N and len(b.received) == N, what="a and b complete")
    await stop(runner, task)
    assert await checkpoint(store, "a") == N and await checkpoint(store, "b") == N
    assert await checkpoint(store, "c") is None


async def test_quorum_not_met_commits_nothing() -> None:
    store = MemoryCheckpointStore()
    a, b, c = ScriptedSink("a"), ScriptedSink("b", script=fails()), ScriptedSink("c", script=fails())
    cfg = config(
        sinks=[sink_doc("a"), sink_doc("b"), sink_doc("c")], commit_policy={"mode": "quorum", "quorum": 2}
    )
    runner, task = await start(cfg, [a, b, c], SyntheticSource(N), store)
    await wait_until(lambda: runner.ctx.stats.commit_failures >= 2, what="quorum unmet")
    await stop(runner, task, drain_timeout=0.5)  # a stuck sink cannot drain
    assert await checkpoint(store, "a") is None


async def test_failed_optional_sink_catches_up_after_restart_without_redelivery_to_others() -> None:
    store = MemoryCheckpointStore()
    cfg = config(sinks=[sink_doc("a"), sink_doc("b", required=False)])
    a1, b1 = ScriptedSink("a"), ScriptedSink("b", required=False, script=fails())
    runner, task = await start(cfg, [a1, b1], SyntheticSource(N), store)
    await wait_until(lambda: len(a1.received) == N, what="first run delivered to a")
    await stop(runner, task)
    assert await checkpoint(store, "b") is None

    a2, b2 = ScriptedSink("a"), ScriptedSink("b", required=False)
    source = SyntheticSource(N)
    runner, task = await start(cfg, [a2, b2], source, store)
    await wait_until(lambda: len(b2.received) == N, what="b caught up")
    await stop(runner, task)
    assert source.opened_from == [1]  # the minimum across sinks: b had nothing
    assert b2.received == list(range(1, N + 1))
    assert a2.received == []  # a already had all of it: skipped, not re-delivered
    assert runner.ctx.stats.sinks["a"].skipped == N
    assert await checkpoint(store, "b") == N


async def test_sink_ahead_of_resume_point_skips_what_it_has() -> None:
    store = MemoryCheckpointStore()
    await store.put_many({sink_key("src", "a"): {"seq": 300}, sink_key("src", "b"): {"seq": 100}})
    a, b = ScriptedSink("a"), ScriptedSink("b")
    source = SyntheticSource(N)
    runner, task = await start(config(sinks=[sink_doc("a"), sink_doc("b")]), [a, b], source, store)
    await wait_until(lambda: len(b.received) == N - 100, what="b complete")
    await stop(runner, task)
    assert source.opened_from == [101]
    assert a.received == list(range(301, N + 1))
    assert b.received == list(range(101, N + 1))


async def test_order_is_kept_across_retries() -> None:
    rng = random.Random(3)

    def flaky(call: int, events: list[Event]) -> None:
        if rng.random() < 0.3:
            raise RetryableSinkError("flaky")

    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=flaky)
    runner, task = await start(
        config(sinks=[sink_doc("a")], batch={"max_events": 37}), [a], SyntheticSource(N), store
    )
    await wait_until(lambda: len(a.received) >= N, what="all delivered")
    await stop(runner, task)
    assert a.received == list(range(1, N + 1))  # retries never deliver a partial batch here
    assert runner.ctx.stats.sinks["a"].retries > 0


async def test_worker_that_raises_is_restarted_and_pipeline_continues_without_loss() -> None:
    def crash_once(call: int, events: list[Event]) -> None:
        if call == 3:
            raise RuntimeError("bug in sink")

    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=crash_once)
    runner, task = await start(
        config(sinks=[sink_doc("a")], batch={"max_events": 50}), [a], SyntheticSource(N), store
    )
    await wait_until(lambda: runner.ctx.stats.events_committed >= N, what="all committed")
    snap = runner.snapshot().find("DeliveryWorker[a]")
    await stop(runner, task)
    assert snap is not None and snap.restarts == 1
    assert snap.last_error == "RuntimeError: bug in sink"
    assert first_seen(a.received) == list(range(1, N + 1))
    assert await checkpoint(store, "a") == N


async def test_a_wait_cancelled_inside_a_sinks_client_library_is_retried_not_a_crash() -> None:
    """A client library that cancels a wait of its own (nats-py did, once, in a chaos run while
    its cluster lost a leader) ends the sink's call in a ``CancelledError`` although nobody is
    stopping its worker: retried as a lost connection; it crashed the worker."""
    loop = asyncio.get_running_loop()

    async def reset_once(call: int, events: list[Event]) -> None:
        if call == 3:
            wait = loop.create_future()  # a call pending in the library, which cancels it
            loop.call_soon(wait.cancel)
            await wait

    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=reset_once)
    with capture_logs() as logs:
        runner, task = await start(
            config(sinks=[sink_doc("a")], batch={"max_events": 50}), [a], SyntheticSource(N), store
        )
        await wait_until(lambda: runner.ctx.stats.events_committed >= N, what="all committed")
        snap = runner.snapshot().find("DeliveryWorker[a]")
        stats = runner.ctx.stats.sinks["a"]
        await stop(runner, task)
    assert snap is not None and snap.restarts == 0
    [said] = [e for e in logs if e["event"] == "sink_wait_cancelled"]  # with where the library cancelled
    assert said["sink"] == "a" and said["exc_info"] is True and said["log_level"] == "warning"
    assert stats.retries == 1 and "cancelled (retried as a connection lost)" in str(stats.last_error)
    assert a.received == list(range(1, N + 1))
    assert await checkpoint(store, "a") == N


async def test_exceeding_intensity_fails_pipeline_and_health_turns_503() -> None:
    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=fails(RuntimeError))
    cfg = config(
        sinks=[sink_doc("a")],
        supervision={"max_restarts": 2, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}},
    )
    runner, task = await start(cfg, [a], SyntheticSource(N), store)
    app = build_app({"t": runner})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        assert (await client.get("/health")).status_code == 200
        await asyncio.wait_for(task, 20)
        assert runner.state == "failed"
        resp = await client.get("/health")
        assert resp.status_code == 503
        body = resp.json()
        assert body["status"] == "failed"
        assert "exceeded its restart intensity" in body["reasons"][0]
        assert "PipelineSupervisor[t]" in body["reasons"][0]
        tree = (await client.get("/pipelines/t/actors")).json()
        assert tree["state"] == "failed"
    assert await checkpoint(store, "a") is None


async def test_non_retryable_error_on_required_sink_fails_the_pipeline_at_once_with_sink_id() -> None:
    """What no retry fixes (bad credentials, a missing target) is not restarted until the
    intensity runs out: the pipeline fails at the first such answer, saying which sink and why
    (``POST /pipelines/{name}/resume`` starts it again once fixed)."""
    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=fails(NonRetryableSinkError))
    cfg = config(
        sinks=[sink_doc("a")],
        supervision={"max_restarts": 50, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}},
    )
    runner, task = await start(cfg, [a], SyntheticSource(N), store)
    await asyncio.wait_for(task, 20)
    assert runner.state == "failed"
    assert runner.failure == "sink 'a': down (call 1)"
    snap = runner.snapshot().find("DeliveryCoordinator")
    assert snap is not None and snap.state == "fatal" and snap.last_error == "fatal: sink 'a': down (call 1)"
    assert a.calls == 1  # before: once per incarnation, until the restart intensity ran out
    assert await checkpoint(store, "a") is None


async def test_max_ms_flushes_a_partial_batch() -> None:
    store = MemoryCheckpointStore()
    a = ScriptedSink("a")
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 10_000, "max_ms": 30})
    runner, task = await start(cfg, [a], SyntheticSource(7), store)
    await wait_until(lambda: len(a.received) == 7, timeout=5, what="partial batch flushed by time")
    assert a.calls == 1
    await stop(runner, task)


async def test_transactions_are_not_split_in_the_running_pipeline() -> None:
    store = MemoryCheckpointStore()
    batches: list[list[Event]] = []

    def record(call: int, events: list[Event]) -> None:
        batches.append(list(events))

    a = ScriptedSink("a", script=record)
    source = SyntheticSource(2000, tx_sizes=[1, 7, 120, 3, 45], chunk=50)
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 10, "max_ms": 5})
    runner, task = await start(cfg, [a], source, store)
    await wait_until(lambda: len(a.received) == 2000, what="all delivered")
    await stop(runner, task)
    assert all(b[-1].tx_end for b in batches)
    tx_batches: dict[str, set[int]] = {}
    for i, b in enumerate(batches):
        for e in b:
            tx_batches.setdefault(e.tx_id, set()).add(i)
    assert all(len(s) == 1 for s in tx_batches.values())
    assert max(len(b) for b in batches) >= 120  # a large transaction made a larger batch


@pytest.mark.slow
async def test_backpressure_blocks_the_reader_and_memory_stays_flat() -> None:
    total = 1_000_000
    store = MemoryCheckpointStore()

    async def slow(call: int, events: list[Event]) -> None:
        await asyncio.sleep(0.002)

    a = ScriptedSink("a", script=slow)
    source = SyntheticSource(total, chunk=2000)
    cfg = config(sinks=[sink_doc("a")], batch={"max_events": 2000, "max_ms": 50})
    runner, task = await start(cfg, [a], source, store)
    proc = psutil.Process()
    blocked_seen = 0
    baseline: int | None = None
    peak = 0
    while runner.ctx.stats.events_committed < total:
        await asyncio.sleep(0.01)
        if runner.tree.accumulator.waiting_senders > 0:
            blocked_seen += 1  # the reader is parked in tell() on a full mailbox
        committed = runner.ctx.stats.events_committed
        rss = proc.memory_info().rss
        if baseline is None and committed >= total // 10:
            baseline = rss
        if baseline is not None:
            peak = max(peak, rss)
        # the reader can never be far ahead of delivery: mailboxes are bounded
        assert runner.ctx.stats.events_read - committed <= 2000 * 12
        assert not task.done()
    await stop(runner, task)
    assert blocked_seen > 10
    assert baseline is not None
    assert peak - baseline < 40 * 1024 * 1024, f"RSS grew {(peak - baseline) / 1e6:.1f} MB"
    assert len(a.received) == total


class GatedSource(SyntheticSource):
    """Holds the read under way once ``gate`` is set, until it is opened."""

    def __init__(self, total: int, chunk: int) -> None:
        super().__init__(total, chunk=chunk)
        self.gate: asyncio.Event | None = None
        self.held = asyncio.Event()

    async def read(self) -> list[Event]:
        if (gate := self.gate) is not None:
            self.held.set()
            await gate.wait()
            self.gate = None
        return await super().read()


async def test_a_rewind_and_a_pause_arriving_during_one_read_never_stall_the_reader() -> None:
    """After each read the reader tells itself to read again, into its own mailbox of two. A
    lagging sink's Rewind and a pause's StopReading, arriving during one read, filled it, and that
    tell waited for room that only the reader itself makes: it stood still for good, the pause
    (or a drain) gave up after 30 s, and nothing was read again. Found in CI: a flapping optional
    sink's Rewind and the drain's StopReading. Now the reader never waits on its own mailbox."""
    source = GatedSource(10_000_000, chunk=100)
    runner, task = await start(
        config(sinks=[sink_doc("a")]), [ScriptedSink("a")], source, MemoryCheckpointStore()
    )
    await wait_until(lambda: runner.ctx.stats.events_read > 0, what="reading")
    source.gate = asyncio.Event()
    await source.held.wait()
    assert runner.tree.reader.try_tell(Rewind())  # as the coordinator tells it
    with capture_logs() as logs:
        pausing = asyncio.create_task(runner.pause())
        await anyio.wait_all_tasks_blocked()
        assert runner.tree.reader.mailbox_depth == 2  # full: the Rewind and the StopReading
        source.gate.set()
        await anyio.wait_all_tasks_blocked()
        assert pausing.done() and runner.state == "paused"
    await pausing
    assert [e["event"] for e in logs if e["event"] == "reader_told_at_start"] == []
    assert len(source.opened_from) == 2  # the Rewind was done
    read = runner.ctx.stats.events_read
    await anyio.wait_all_tasks_blocked()
    assert runner.ctx.stats.events_read == read  # paused
    await runner.resume()
    await wait_until(lambda: runner.ctx.stats.events_read > read, what="reading again")
    await stop(runner, task)


async def test_retry_and_backoff_delays_run_on_the_injected_clock() -> None:
    """Delivery retries and the coordinator's backoff wait on the pipeline's clock: with a fake
    one the test takes no real time for them, and the delays are the configured ones."""
    failing = {1, 2, 3, 4}  # calls 1-3: the worker's three attempts; 4: the coordinator's retry

    def script(call: int, events: list[Event]) -> None:
        if call in failing:
            raise RetryableSinkError(f"down (call {call})")

    clock = FakeClock()
    store = MemoryCheckpointStore()
    a = ScriptedSink("a", script=script)
    cfg = config(sinks=[sink_doc("a")], supervision={"backoff": {"base_ms": 500, "max_ms": 4000}})
    runner = PipelineRunner(
        cfg, store=store, sinks={"a": a}, source=SyntheticSource(10), clock=clock, rng=random.Random(7)
    )
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= 10, what="all committed")
    await stop(runner, task)
    assert a.received == list(range(1, 11))
    # Calls 1-3 fail: the worker retries twice (0.1 s, then 0.2 s, each with equal jitter) and
    # reports the batch failed; the coordinator backs off (0.5 s, jittered) and asks again;
    # call 4 fails and the worker retries once more (0.1 s); call 5 delivers.
    assert len(clock.sleeps) == 4, clock.sleeps
    first, second, coordinator, again = clock.sleeps
    assert 0.05 <= first <= 0.1 and 0.1 <= second <= 0.2 and 0.05 <= again <= 0.1
    assert 0.25 <= coordinator <= 0.5
    assert clock.now() == pytest.approx(sum(clock.sleeps))


async def test_quorum_gives_up_when_non_retryable_failures_leave_too_few_sinks() -> None:
    store = MemoryCheckpointStore()
    a = ScriptedSink("a")
    b, c = (
        ScriptedSink("b", script=fails(NonRetryableSinkError)),
        ScriptedSink("c", script=fails(NonRetryableSinkError)),
    )
    cfg = config(
        sinks=[sink_doc("a"), sink_doc("b"), sink_doc("c")],
        commit_policy={"mode": "quorum", "quorum": 2},
        supervision={"max_restarts": 1, "within_seconds": 60, "backoff": {"base_ms": 1, "max_ms": 5}},
    )
    runner, task = await start(cfg, [a, b, c], SyntheticSource(N), store)
    await asyncio.wait_for(task, 20)
    assert runner.state == "failed"
    snap = runner.snapshot().find("DeliveryCoordinator")
    assert snap is not None and snap.last_error is not None
    assert "quorum 2 cannot be met: only 1 sinks can still take batch" in snap.last_error
    assert "sink 'b': down" in snap.last_error and "sink 'c': down" in snap.last_error
    assert runner.failure == snap.last_error.removeprefix("fatal: ")
    assert b.calls == 1 and c.calls == 1  # not retried: no incarnation of the coordinator could
    assert await checkpoint(store, "a") is None


async def test_a_delivery_that_does_not_return_lists_its_sink_unavailable_until_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sink retrying inside one call (Kafka's transaction commit, up to a minute) raised
    nothing, so /health said ok while nothing could be delivered. After ``UNANSWERED_S`` the
    sink is listed unavailable (degraded); when the call returns, it is available again and
    the batch committed."""
    monkeypatch.setattr(delivery, "UNANSWERED_S", 0.05)
    answered = asyncio.Event()

    async def hangs_once(call: int, events: list[Event]) -> None:
        if call == 1:
            await answered.wait()

    a = ScriptedSink("a", script=hangs_once)
    runner, task = await start(
        config(sinks=[sink_doc("a")]), [a], SyntheticSource(10), MemoryCheckpointStore()
    )
    await wait_until(lambda: "sink:a" in runner.ctx.availability.view(), what="the sink listed unavailable")
    assert (
        runner.ctx.availability.view()["sink:a"]["last_error"]
        == "delivery unanswered for 0.05 s (still trying)"
    )
    assert runner.ctx.stats.events_committed == 0
    answered.set()
    await wait_until(lambda: runner.ctx.stats.events_committed == 10, what="all committed")
    assert not runner.ctx.availability.degraded
    await stop(runner, task)
    assert a.received == list(range(1, 11))
