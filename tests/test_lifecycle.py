"""Pipelines created, paused, resumed, patched, stopped and deleted over REST and the CLI against
a running serve with a PostgreSQL source (issue 16, acceptance 3): the file sink ends with every
row exactly once, and a pipeline created over REST comes back after serve restarts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from deltaforge.snapshot.chunks import ChunkReader
from deltaforge.snapshot.window import TableRef
from deltaforge.sources.base import SourceUnavailable
from supervision import Unavailable
from tests.helpers import jsonl, wait_until_sync
from tests.kit import SyntheticSource
from tests.serve_proc import Serve
from tests.servers.postgres import Postgres

TOKEN = {"Authorization": "Bearer t0ken"}
ENV = {"DELTAFORGE_API_TOKEN": "t0ken"}


def _ids(tmp: Path) -> list[int]:
    path = tmp / "events.jsonl"
    return [int(d["after"]["id"]) for d in jsonl(path) if d["op"] == "c"] if path.exists() else []


def _cli(serve: Serve, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deltaforge", "pipelines", *args, "--api", serve.url("")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **ENV})  # fmt: skip


def test_lifecycle_over_rest_and_cli_loses_and_repeats_nothing(tmp_path: Path, postgres: Postgres) -> None:
    db = "life_" + tmp_path.name[-12:].lower().replace("-", "_")
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}".encode())
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute(b"CREATE TABLE items (id int PRIMARY KEY, v text)")

    def write(ids: range) -> None:
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            for i in ids:
                conn.execute(b"INSERT INTO items VALUES (%s, 'x')", (i,))

    def delivered(n: int) -> None:
        wait_until_sync(lambda: len(_ids(tmp_path)) >= n, timeout=60, what=f"{n} rows delivered")

    source = {
        "id": "pg",
        "dsn": postgres.dsn(db),
        "tables": ["public.items"],
        "slot": f"s_{db}",
        "publication": f"p_{db}",
    }
    doc: dict[str, Any] = {
        "apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "shop"},
        "spec": {"source": {"type": "postgres", "config": source},
                 "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "events.jsonl")}}],
                 "batch": {"max_events": 50, "max_ms": 20},
                 "storage": {"type": "sqlite", "path": str(tmp_path / "cp.db")}},
    }  # fmt: skip
    with Serve(tmp_path, "--no-workload", env=ENV) as serve:
        serve.wait_api()
        url = serve.url("/pipelines")
        assert httpx.post(url, json=doc).status_code == 401  # no token
        created = httpx.post(url, json=doc, headers=TOKEN)
        assert created.status_code == 201 and created.json()["name"] == "shop"
        again = httpx.post(url, json=doc, headers=TOKEN)
        assert again.status_code == 409 and again.json()["code"] == "exists"
        serve.wait_source_open("shop")
        write(range(1, 51))
        delivered(50)

        paused = _cli(serve, "pause", "shop")
        assert paused.returncode == 0, paused.stderr
        assert serve.get("/pipelines/shop").json()["state"] == "paused"
        read = serve.get("/pipelines/shop").json()["counters"]["events_read"]
        write(range(51, 101))
        time.sleep(1.5)  # an observation window, not a wait: running, these rows are read within it
        assert serve.get("/pipelines/shop").json()["counters"]["events_read"] == read
        assert len(_ids(tmp_path)) == 50
        assert httpx.post(f"{url}/shop/resume", headers=TOKEN).json()["state"] == "running"
        delivered(100)

        patched = httpx.patch(f"{url}/shop", json={"spec": {"batch": {"max_events": 7}}}, headers=TOKEN)
        assert patched.status_code == 200, patched.text
        assert serve.get("/pipelines/shop/spec").json()["spec"]["batch"] == {"max_events": 7, "max_ms": 20}
        bad = httpx.patch(f"{url}/shop", json={"spec": {"batch": {"max_events": 0}}}, headers=TOKEN)
        assert bad.status_code == 400 and bad.json()["code"] == "invalid"
        assert any("spec.batch.max_events" in e for e in bad.json()["errors"])
        write(range(101, 151))
        delivered(150)

        stopped = _cli(serve, "stop", "shop")
        assert stopped.returncode == 0 and serve.get("/pipelines/shop").json()["state"] == "stopped"
        write(range(151, 201))
        assert httpx.post(f"{url}/shop/pause", headers=TOKEN).json()["code"] == "bad_state"
        assert httpx.post(f"{url}/shop/resume", headers=TOKEN).status_code == 200
        delivered(200)
        assert serve.terminate() == 0

    with Serve(tmp_path, "--no-workload", env=ENV) as serve:  # created over REST: it comes back
        serve.wait_api()
        serve.wait_source_open("shop")
        assert serve.get("/pipelines/shop/spec").json()["spec"]["batch"]["max_events"] == 7
        write(range(201, 251))
        delivered(250)
        listed = _cli(serve, "list")
        assert listed.returncode == 0 and '"name": "shop"' in listed.stdout
        assert 'pipeline="shop"' in serve.get("/metrics").text
        deleted = _cli(serve, "delete", "shop")
        assert deleted.returncode == 0, deleted.stdout
        assert serve.get("/pipelines/shop").status_code == 404
        assert 'pipeline="shop"' not in serve.get("/metrics").text  # no series left behind
        assert _cli(serve, "get", "shop").returncode == 1
        assert serve.terminate() == 0

    with Serve(tmp_path, "--no-workload", env=ENV) as serve:  # deleted: it does not
        serve.wait_api()
        assert serve.get("/pipelines/shop").status_code == 404
        assert serve.terminate() == 0
    ids = _ids(tmp_path)
    assert sorted(ids) == list(range(1, 251)) and len(ids) == 250  # each row once, none lost


def test_a_created_pipeline_that_no_longer_validates_at_a_start_is_failed_not_gone(tmp_path: Path) -> None:
    """A pipeline created over REST is kept as given, ``${VAR}`` references unexpanded; started
    again without that variable set, it was left out with a log line and ``/health`` said ok: a
    pipeline gone without a word. It is failed now, with why, until deleted, or patched valid."""
    doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": "orders"},
           "spec": {"source": {"type": "turso", "config": {"id": "o", "path": str(tmp_path / "o.db")}},
                    "sinks": [{"type": "file", "config": {"id": "f", "path": "${DF_OUT_DIR}/events.jsonl"}}],
                    "storage": {"type": "sqlite", "path": str(tmp_path / "cp.db")}}}  # fmt: skip
    data = tmp_path / "data"
    data.mkdir()
    (data / "pipelines.json").write_text(json.dumps({"orders": doc}))
    env = {k: v for k, v in os.environ.items() if k != "DF_OUT_DIR"} | ENV
    with Serve(tmp_path, "--no-workload", "--data-dir", str(data), env=env) as serve:
        serve.wait_api()
        health = serve.get("/health")
        why = "orders: created over REST, not restored at this start: spec.sinks[0].config.path: environment variable DF_OUT_DIR is not set"
        assert health.status_code == 503 and why in health.json()["reasons"], health.text
        assert serve.get("/ready").status_code == 503
        assert {"name": "orders", "state": "failed", "failure": why.split(": ", 1)[1]} in serve.get(
            "/pipelines"
        ).json()
        assert serve.get("/pipelines/orders/checkpoints").json()["code"] == "not_restored"
        url = serve.url("/pipelines/orders")
        assert httpx.delete(url, params={"checkpoints": "delete"}, headers=TOKEN).json()["code"] == "invalid"
        assert httpx.delete(url, headers=TOKEN).status_code == 200
        assert serve.get("/health").json()["status"] == "ok"
        assert json.loads((data / "pipelines.json").read_text()) == {}
        assert serve.terminate() == 0
    (data / "pipelines.json").write_text(json.dumps({"orders": doc}))
    with Serve(tmp_path, "--no-workload", "--data-dir", str(data), env=env) as serve:  # fixed by a patch
        serve.wait_api()
        fix = {
            "spec": {
                "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "events.jsonl")}}]
            }
        }
        patched = httpx.patch(serve.url("/pipelines/orders"), json=fix, headers=TOKEN)
        assert patched.status_code == 200, patched.text
        serve.wait_source_open("orders")
        assert serve.get("/health").json() == {
            "status": "ok",
            "pipelines": {"demo": "running", "orders": "running"},
        }
        assert serve.terminate() == 0


def test_a_patch_merges_as_rfc_7386_says() -> None:
    from deltaforge.service.manager import merge

    base = {"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]}
    assert merge(base, {"b": {"c": None, "e": 4}, "l": [3], "f": "x"}) == {
        "a": 1, "b": {"d": 3, "e": 4}, "l": [3], "f": "x"
    }  # fmt: skip
    assert base == {"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]}  # the original is left alone


async def test_config_file_pipelines_are_read_only_and_unknown_names_not_found(tmp_path: Path) -> None:
    import pytest

    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.service.manager import LifecycleError, PipelineManager
    from deltaforge.service.registry import PipelineRegistry
    from tests.kit import config, sink_doc

    manager = PipelineManager(PipelineRegistry(tmp_path / "pipelines.json"), PipelineRunner)
    manager.add(config(sinks=[sink_doc("a")]))
    for call, code in ((manager.patch("t", {}), "read_only"), (manager.delete("t"), "read_only"),
                       (manager.pause("nope"), "not_found"), (manager.create({"kind": "Pipeline"}), "invalid")):  # fmt: skip
        with pytest.raises(LifecycleError) as exc:
            await call
        assert exc.value.code == code
    # a name's lock lives while a request uses it: those asked for above are not kept for ever
    for n in range(100):
        with pytest.raises(LifecycleError):
            await manager.stop(f"unknown-{n}")
    assert dict(manager._locks) == {}


async def test_a_paused_pipeline_stays_paused_when_its_tree_restarts() -> None:
    import asyncio

    import anyio

    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.state.checkpoints import MemoryCheckpointStore
    from tests.helpers import wait_until
    from tests.kit import ScriptedSink, config, sink_doc

    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(),
                            source=SyntheticSource(1_000_000, chunk=100), sinks={"a": ScriptedSink("a")})  # fmt: skip
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_read > 500, what="reading")
    await runner.pause()
    await runner.tree.accumulator.tell(object())  # it crashes: the whole tree restarts (one_for_all)

    def reader_restarted() -> bool:
        node = runner.snapshot().find("SourceReader")
        return node is not None and node.restarts >= 1 and node.state == "running"

    await wait_until(reader_restarted, what="the reader restarted")
    read = runner.ctx.stats.events_read
    # Every task waits: unpaused, the reader of this source (never idle, no timer) would still be
    # reading, or would have read all of it by now.
    await anyio.wait_all_tasks_blocked()
    assert runner.ctx.stats.events_read == read and runner.state == "paused"
    await runner.resume()
    await wait_until(lambda: runner.ctx.stats.events_read > read, what="reading again")
    await runner.drain()
    await task


async def test_pipelines_created_at_once_all_come_back_after_a_restart(tmp_path: Path) -> None:
    """Each create rewrites the registry file; side by side, two rewrites could land in the other
    order and a pipeline already created (201) was not there after ``serve`` started again."""
    import anyio

    from deltaforge.service.registry import PipelineRegistry

    for round in range(5):
        path = tmp_path / f"pipelines-{round}.json"
        registry, names = PipelineRegistry(path), [f"p{i}" for i in range(40)]
        async with anyio.create_task_group() as tg:
            for name in names:  # a pipeline's document is about a kilobyte
                tg.start_soon(registry.put, name, {"metadata": {"name": name}, "spec": {"x": "y" * 1000}})
        assert sorted(PipelineRegistry(path).load()) == sorted(names)


def turso_to_file(tmp: Path, name: str) -> dict[str, Any]:
    """A pipeline document for the manager's tests: the embedded source, a file sink, no servers."""
    return {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "source": {"type": "turso", "config": {"id": "src", "path": str(tmp / "app.db")}},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "out.jsonl")}}],
            "storage": {"type": "memory"},
        },
    }


async def test_two_creates_of_one_name_at_once_start_one_pipeline(tmp_path: Path) -> None:
    """A client that sends its create twice (a retry after a timeout) gets one pipeline and one
    ``exists``; both used to see the name free, and both started a runner: two pipelines on one
    source and one set of checkpoints, the first left running where no request could reach it."""
    import asyncio

    import pytest

    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.service.manager import LifecycleError, PipelineManager
    from deltaforge.service.registry import PipelineRegistry

    manager = PipelineManager(PipelineRegistry(tmp_path / "pipelines.json"), PipelineRunner, env={})
    doc = turso_to_file(tmp_path, "twice")
    results = await asyncio.gather(manager.create(doc), manager.create(doc), return_exceptions=True)
    created = [r for r in results if isinstance(r, PipelineRunner)]
    refused = [r for r in results if isinstance(r, LifecycleError)]
    assert len(created) == 1 and [e.code for e in refused] == ["exists"]
    assert manager.pipelines["twice"] is created[0]
    with pytest.raises(LifecycleError, match="exists"):
        await manager.create(doc)
    await manager.drain_all()
    assert all(t.done() for t in manager.tasks.values())


async def test_a_shutdown_during_a_patch_drains_the_patched_pipeline_and_starts_none_after(
    tmp_path: Path,
) -> None:
    """serve's shutdown waits for a patch's restart and drains the pipeline it started; before,
    the restart could start the patched pipeline after the drain had passed it (left running past
    the end of serve, or the shutdown waiting on it for ever). Nothing starts once it began."""
    import asyncio

    import anyio
    import pytest

    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.service.manager import LifecycleError, PipelineManager
    from deltaforge.service.registry import PipelineRegistry
    from tests.helpers import wait_until

    manager = PipelineManager(PipelineRegistry(tmp_path / "pipelines.json"), PipelineRunner, env={})
    doc = turso_to_file(tmp_path, "p")
    first = await manager.create(doc)
    await wait_until(lambda: first.state == "running", what="the pipeline running")
    patch = asyncio.create_task(manager.patch("p", {"spec": {"batch": {"max_events": 50}}}))
    await wait_until(lambda: manager._changing("p").locked(), what="the patch under way")
    with anyio.fail_after(60):  # a guard against the old hang, not a timing goal
        await manager.drain_all()
        patched = await patch
    assert patched is manager.pipelines["p"] and patched is not first
    assert patched.state == "stopped" and all(t.done() for t in manager.tasks.values())
    with pytest.raises(LifecycleError, match="shutting down"):
        await manager.create({**doc, "metadata": {"name": "late"}})
    assert "late" not in manager.pipelines


class GateClock:
    """A clock whose sleeps (the supervisor's backoff) wait until the test opens ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sleeping = 0

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        self.sleeping += 1
        await self.gate.wait()


async def test_a_pipeline_whose_source_is_down_can_be_paused_and_reads_nothing_until_resumed() -> None:
    """Paused while its source is down (the reader waits for its next restart): the pause holds,
    the reader opens the source when it comes back but reads nothing, and a resume reads on.
    Before, the pause failed with ActorStopped (a 500 over REST), when an operator needs it most."""
    import anyio

    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.state.checkpoints import MemoryCheckpointStore
    from supervision import Unavailable
    from tests.helpers import wait_until
    from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc

    class Down(SyntheticSource):
        down = True

        async def open(self, resume_after: Any) -> None:
            if self.down:
                raise Unavailable("connection refused")
            await super().open(resume_after)

    clock, source, sink = GateClock(), Down(10), ScriptedSink("a")
    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(), source=source,
                            sinks={"a": sink}, clock=clock)  # fmt: skip
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: clock.sleeping > 0, what="the reader down, waiting for its restart")
    await runner.pause()
    assert runner.state == "paused" and runner.ctx.paused
    source.down = False
    clock.gate.set()  # the restart comes
    await wait_until(lambda: source.opened_from != [], what="the source opened again")

    def reader_running() -> bool:
        node = runner.snapshot().find("SourceReader")
        return node is not None and node.state == "running"

    await wait_until(reader_running, what="the reader running")
    await anyio.wait_all_tasks_blocked()
    assert source.reads == 0 and sink.received == []
    await runner.resume()
    await wait_until(lambda: sink.received == list(range(1, 11)), what="everything read after the resume")
    await runner.drain()
    await task


async def test_a_stop_between_two_attempts_at_a_source_that_is_down_says_so_not_a_failed_drain() -> None:
    """A stop while the reader waits for its next attempt at a source that is down: the actors
    of its restart group are down and hold nothing, so the drain is skipped and says why
    (``pipeline_drain_skipped``), at once. Before, it said ``pipeline_drain_incomplete`` ("actor
    'SourceReader' is not running"), a warning, as if something were left undelivered."""
    from structlog.testing import capture_logs

    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.state.checkpoints import MemoryCheckpointStore
    from supervision import Unavailable
    from tests.helpers import wait_until
    from tests.kit import ScriptedSink, SyntheticSource, config, sink_doc

    class Down(SyntheticSource):
        async def open(self, resume_after: Any) -> None:
            raise Unavailable("connection refused")

    clock = GateClock()
    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(), source=Down(10),
                            sinks={"a": ScriptedSink("a")}, clock=clock)  # fmt: skip
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await wait_until(lambda: clock.sleeping > 0, what="the reader down, waiting for its next attempt")
        await asyncio.wait_for(runner.drain(), 10)
        await asyncio.wait_for(task, 10)
    said = [e["event"] for e in logs if str(e["event"]).startswith("pipeline_drain")]
    assert said == ["pipeline_drain_skipped"], said


async def test_a_snapshot_asked_for_while_the_source_is_down_is_refused_as_unavailable() -> None:
    """POST /snapshots while the reader waits for its source's next restart: 503 ``unavailable``
    naming the source's error, nothing started; once the source is back the same request is
    taken. Before, the reader's ActorStopped came out as a 500."""
    import httpx

    from deltaforge.api.app import build_app
    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.state.checkpoints import MemoryCheckpointStore
    from tests.helpers import wait_until
    from tests.kit import ScriptedSink, config, sink_doc

    clock, source, sink = GateClock(), _DownWithSnapshots(10), ScriptedSink("a")
    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(), source=source,
                            sinks={"a": sink}, clock=clock)  # fmt: skip
    task = asyncio.create_task(runner.run())
    app = build_app({"p": runner})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        await wait_until(lambda: clock.sleeping > 0, what="the reader down, waiting for its restart")
        resp = await client.post("/pipelines/p/snapshots", json={"tables": ["db.t"]})
        assert resp.status_code == 503, resp.text
        body = resp.json()
        assert body["code"] == "unavailable" and "connection refused" in body["message"]
        assert "nothing was started" in body["message"] and runner.ctx.snapshot.to_dict()["current"] is None
        assert source.asked == []
        source.down = False
        clock.gate.set()
        await wait_until(lambda: sink.received == list(range(1, 11)), what="reading again")
        resp = await client.post("/pipelines/p/snapshots", json={"tables": ["db.t"]})
        assert resp.status_code == 202, resp.text
        assert source.asked and all(names == ["db.t"] for names in source.asked)
    await runner.drain()
    await task


async def test_a_source_lost_while_a_snapshot_finds_its_tables_is_unavailable_not_an_error() -> None:
    """The server goes away while the snapshot request looks its tables up: 503 ``unavailable``
    (the reader restarts and waits for it, as for any outage), not a 500."""
    import httpx

    from deltaforge.api.app import build_app
    from deltaforge.pipeline.runner import PipelineRunner
    from deltaforge.state.checkpoints import MemoryCheckpointStore
    from tests.helpers import wait_until
    from tests.kit import ScriptedSink, config, sink_doc

    source, sink = _DownWithSnapshots(10, down=False), ScriptedSink("a")
    runner = PipelineRunner(config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(), source=source,
                            sinks={"a": sink})  # fmt: skip
    task = asyncio.create_task(runner.run())
    app = build_app({"p": runner})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        await wait_until(lambda: sink.received == list(range(1, 11)), what="everything read")
        source.lookups_fail = True
        resp = await client.post("/pipelines/p/snapshots", json={"tables": ["db.t"]})
        assert resp.status_code == 503, resp.text
        assert (
            resp.json()["code"] == "unavailable" and "server closed the connection" in resp.json()["message"]
        )
    await runner.drain()
    await task


class _DownWithSnapshots(SyntheticSource):
    """A synthetic source that can be down and whose chunk reader knows one empty table, ``db.t``
    (these tests are about asking for a snapshot, not taking one)."""

    def __init__(self, total: int, down: bool = True) -> None:
        super().__init__(total)
        self.down, self.lookups_fail = down, False
        self.asked: list[list[str]] = []

    async def open(self, resume_after: Any) -> None:
        if self.down:
            raise Unavailable("connection refused")
        await super().open(resume_after)

    def chunk_reader(self, settings: Any) -> Any:
        return _OneTable(self)


class _OneTable(ChunkReader):
    def __init__(self, source: _DownWithSnapshots) -> None:
        self.source = source

    async def open(self, parallel: int) -> None:
        pass

    async def close(self) -> None:
        pass

    async def tables(self, names: list[str] | None) -> list[TableRef]:
        if self.source.lookups_fail:
            raise SourceUnavailable("synthetic source: server closed the connection")
        self.source.asked.append(list(names or []))
        return [TableRef("db.t", ("id",))]

    async def estimate(self, table: TableRef) -> int:
        return 0

    async def chunk(self, table: TableRef, after: Any, limit: int) -> Any:
        return [], after, False  # an empty table

    async def watermark(self, kind: str, window: str) -> None:
        pass  # never seen in the stream: the window stays pending, as these tests need nothing more

    def name_of(self, e: Any) -> str:
        return "db.t"

    def is_signal(self, e: Any) -> bool:
        return False

    def mark_of(self, e: Any) -> None:
        return None

    def signal_of(self, e: Any) -> None:
        return None

    def source_info(self, table: TableRef, at: Any, ts_ms: int) -> Any:
        raise AssertionError("an empty table has no rows")


def test_a_pipeline_deleted_with_its_checkpoints_drops_its_postgres_slot(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A replication slot keeps every WAL segment from its position on, for ever: one whose pipeline
    was deleted with its checkpoints (``delete --delete-checkpoints``), which nothing will read
    again, filled the source server's disk. It is dropped with them; a pipeline deleted keeping its
    checkpoints keeps its slot (created again, it resumes there)."""
    db = "gone_" + tmp_path.name[-12:].lower().replace("-", "_")
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}".encode())
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute(b"CREATE TABLE items (id int PRIMARY KEY)")

    def slots() -> list[str]:
        with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
            rows = conn.execute(
                b"SELECT slot_name FROM pg_replication_slots WHERE database = %s", (db,)
            ).fetchall()
        return [str(r[0]) for r in rows]

    def doc(name: str) -> dict[str, Any]:
        source = {"id": name, "dsn": postgres.dsn(db), "tables": ["public.items"], "slot": f"s_{name}_{db}",
                  "publication": f"p_{name}_{db}"}  # fmt: skip
        return {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": name},
                "spec": {"source": {"type": "postgres", "config": source},
                         "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / f"{name}.jsonl")}}],
                         "storage": {"type": "sqlite", "path": str(tmp_path / "cp.db")}}}  # fmt: skip

    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--no-workload", "--log-file", str(log), env=ENV) as serve:
        serve.wait_api()
        for name in ("kept", "gone"):
            assert httpx.post(serve.url("/pipelines"), json=doc(name), headers=TOKEN).status_code == 201
            serve.wait_source_open(name)
        assert sorted(slots()) == [f"s_gone_{db}", f"s_kept_{db}"]
        assert _cli(serve, "delete", "kept").returncode == 0
        deleted = _cli(serve, "delete", "gone", "--delete-checkpoints")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert slots() == [f"s_kept_{db}"]
        assert serve.terminate() == 0
    [dropped] = [r for r in jsonl(log) if r["event"] == "slot_dropped"]
    assert dropped["slot"] == f"s_gone_{db}" and dropped["pipeline"] == "gone"
