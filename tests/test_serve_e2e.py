"""``python -m deltaforge serve`` end to end: the default pipeline, the API, the CLI, signals."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import PYTHON_M, Serve, free_port

lines = jsonl


def test_default_pipeline_runs_with_no_external_server(tmp_path: Path) -> None:
    events = tmp_path / "data" / "events.jsonl"
    with Serve(tmp_path, "--log-file", "data/deltaforge.log") as serve:
        wait_until_sync(lambda: len(lines(events)) > 0, timeout=10, what="events in ./data/events.jsonl")
        serve.wait_api()
        assert serve.get("/health").json() == {"status": "ok", "pipelines": {"demo": "running"}}
        [p] = serve.get("/pipelines").json()
        assert p["name"] == "demo" and p["state"] == "running"
        wait_until_sync(
            lambda: serve.get("/pipelines/demo").json()["counters"]["batches_committed"] > 0, what="a commit"
        )
        tree = serve.get("/pipelines/demo/actors").json()
        assert tree["name"] == "PipelineSupervisor[demo]" and tree["state"] == "running"
        names = [c["name"] for c in tree["children"]]
        assert names == [
            "CheckpointCommitter",
            "DeliverySupervisor",
            "DeliveryCoordinator",
            "Accumulator",
            "FailoverReconciler",
            "DemoWorkload",
            "SourceReader",
        ]
        workers = tree["children"][1]["children"]
        assert {w["name"] for w in workers} == {"DeliveryWorker[events-file]", "DeliveryWorker[console]"}
        assert all("mailbox" in w for w in workers)
        cps = serve.get("/pipelines/demo/checkpoints").json()
        assert cps["events-file"]["key"] == "demo::sink::events-file"
        assert cps["events-file"]["position"]["change_id"] > 0
        assert serve.get("/pipelines/nope").status_code == 404
        assert serve.terminate() == 0
    out = (tmp_path / "serve.out").read_text()
    assert "demo.orders #1 insert" in out  # the readable stdout sink
    err = (tmp_path / "serve.err").read_text()
    assert '"event":"pipeline_drained"' in err

    # After a graceful stop every delivered event is checkpointed: the checkpoint is the last line.
    evs = lines(events)
    last = evs[-1]["source"]["change_id"]  # type: ignore[index]
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "checkpoints", "--storage-path", "data/deltaforge.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    cp_line = next(x for x in r.stdout.splitlines() if x.startswith("demo::sink::events-file"))
    cp = int(re.findall(r"'change_id': (\d+)", cp_line)[0])
    assert cp >= last  # the checkpoint is the tx commit marker after the last event

    # Versions exist and the logs viewer filters the JSON log.
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "checkpoints", "--storage-path", "data/deltaforge.db",
         "--versions", "demo::sink::events-file"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0 and len(r.stdout.splitlines()) >= 1
    # One sink's checkpoint forgotten (a sink whose position alone was lost): the others stay.
    forget = [
        sys.executable,
        "-m",
        "deltaforge",
        "checkpoints",
        "--storage-path",
        "data/deltaforge.db",
        "--forget",
    ]
    r = subprocess.run(
        [*forget, "demo::sink::nope"], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 1 and "no checkpoint demo::sink::nope" in r.stderr
    r = subprocess.run([*forget, "demo::memo"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "sinks' checkpoint keys" in r.stderr
    r = subprocess.run(
        [*forget, "demo::sink::events-file"], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(forget[:-1], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    held = [x.split()[0] for x in r.stdout.splitlines()]
    assert "demo::sink::events-file" not in held and "demo::sink::console" in held
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "logs", "--pipeline", "demo", "--actor", "SourceReader",
         "--color", "never", "data/deltaforge.log"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "demo/SourceReader source_opening" in r.stdout
    assert "pipeline_drained" not in r.stdout  # filtered out: not that actor


def test_no_workload_flag_starts_idle_pipeline(tmp_path: Path) -> None:
    with Serve(tmp_path, "--no-workload") as serve:
        serve.wait_api()
        tree = serve.get("/pipelines/demo/actors").json()
        assert "DemoWorkload" not in [c["name"] for c in tree["children"]]
        assert serve.terminate() == 0
    assert lines(tmp_path / "data" / "events.jsonl") == []


def test_a_port_0_listen_address_is_logged_as_the_port_chosen(tmp_path: Path) -> None:
    """``--api-addr 127.0.0.1:0`` (any free port) was logged as ``127.0.0.1:0``: the API was
    there, and nothing said where. The log now names the port each address was given."""
    with Serve(tmp_path, "--no-workload", "--api-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
               api=False) as serve:  # fmt: skip
        said: dict[str, str] = {}

        def listening() -> bool:
            said.update(
                {d["event"]: d["addr"] for d in jsonl(serve.log) if d["event"].endswith("_listening")}
            )
            return len(said) == 2

        wait_until_sync(listening, timeout=20, what="api_listening and metrics_listening")
        for event, path in (("api_listening", "/health"), ("metrics_listening", "/metrics")):
            host, _, port = said[event].rpartition(":")
            assert host == "127.0.0.1" and port != "0", said
            assert httpx.get(f"http://{said[event]}{path}", timeout=5).status_code == 200
        assert serve.terminate() == 0


def test_bad_config_is_refused_before_start(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text("apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: x}\nspec: {sinks: []}\n")
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "serve", "--config", str(cfg), "--api-addr", "off"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2
    assert "spec.source: required" in r.stderr
    assert "spec.sinks: expected a non-empty list of sinks, got an empty list" in r.stderr


def test_lost_position_halts_with_message_and_health_503(tmp_path: Path) -> None:
    """A checkpoint beyond what the database holds (database replaced) halts; nothing is skipped."""
    import asyncio

    from deltaforge.state.sqlite_store import SqliteCheckpointStore

    async def seed() -> None:
        store = SqliteCheckpointStore(tmp_path / "data" / "deltaforge.db")
        await store.open()
        await store.put_many(
            {"demo::sink::events-file": {"change_id": 10**6}, "demo::sink::console": {"change_id": 10**6}}
        )
        await store.close()

    asyncio.run(seed())
    with Serve(tmp_path) as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/health").status_code == 503, what="503")
        body = serve.get("/health").json()
        [reason] = body["reasons"]
        assert reason.startswith("demo: position lost: checkpoint change_id 1000000 of source 'demo'")
        assert reason.endswith("Re-snapshot required.")
        assert serve.get("/pipelines/demo").json()["state"] == "failed"
        tree = serve.get("/pipelines/demo/actors").json()
        reader = next(c for c in tree["children"] if c["name"] == "SourceReader")
        assert reader["state"] == "fatal" and "position lost" in reader["last_error"]
        assert serve.terminate() == 0
    assert lines(tmp_path / "data" / "events.jsonl") == []


def test_readme_run_command_is_the_one_tested_here() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    assert blocks[0].endswith("python -m deltaforge serve")  # what these tests run
    assert blocks[1] == "bash .ci/run"


def test_logs_reads_stdin_and_filters_by_level_and_event() -> None:
    logs = "\n".join(
        [
            '{"event":"child_restarted","level":"warning","pipeline":"p","actor":"DeliveryWorker[k]","supervisor":"S","reason":"boom"}',
            '{"event":"source_opening","level":"info","pipeline":"p","actor":"SourceReader"}',
            '{"event":"other","level":"error","pipeline":"q","actor":"SourceReader"}',
            "not json at all",
            "[1, 2, 3]",
        ]
    )
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "logs", "--level", "warning", "--pipeline", "p", "--color", "never"],
        input=logs, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert any("p/DeliveryWorker[k] child_restarted" in x and "reason=boom" in x for x in out)
    assert not any("source_opening" in x for x in out)  # below the level
    assert not any(" other" in x for x in out)  # another pipeline
    assert "not json at all" in r.stdout  # shown as is, not dropped
    assert "[1, 2, 3]" in r.stdout  # JSON, but no log record: shown as is too
    only = subprocess.run(
        [sys.executable, "-m", "deltaforge", "logs", "--event", "other", "--event", "source_opening",
         "--color", "never"],
        input=logs, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "source_opening" in only.stdout and " other" in only.stdout
    assert "child_restarted" not in only.stdout  # another event


def test_logs_of_a_file_not_there_says_so_and_with_follow_waits_for_it(tmp_path: Path) -> None:
    """Both were a traceback (FileNotFoundError). ``logs -f`` is started before ``serve`` makes
    its log file as often as after: it waits for the file, as ``tail -F`` does."""
    path = tmp_path / "later.log"
    r = subprocess.run([sys.executable, "-m", "deltaforge", "logs", str(path)], capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert r.returncode == 1 and r.stderr == f"cannot read {path}: No such file or directory\n"
    with subprocess.Popen([sys.executable, "-m", "deltaforge", "logs", "-f", str(path), "--color", "never"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as tail:  # fmt: skip
        try:
            assert tail.stderr is not None and tail.stdout is not None
            assert _line(tail.stderr) == f"waiting for {path} to be made\n"
            path.write_text('{"event":"pipeline_started","level":"info","pipeline":"p"}\n')
            assert "p pipeline_started" in _line(tail.stdout)
        finally:
            tail.kill()


def _line(stream: IO[str], timeout: float = 30) -> str:
    """The next line of a child's pipe, or a failure after ``timeout`` (not a test that hangs)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no line in {timeout} s"
    return stream.readline()


def test_a_crash_is_logged_with_its_traceback(tmp_path: Path) -> None:
    """A source that cannot open (its file is not a database) crashes its reader: every restart
    and the escalation carry the exception's traceback, its cause chained, in the JSON log."""
    (tmp_path / "src.db").write_bytes(b"not a database file " * 500)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: crashy}\nspec:\n"
        f"  source: {{type: turso, config: {{id: s, path: {tmp_path / 'src.db'}}}}}\n"
        f"  sinks: [{{type: file, config: {{id: f, path: {tmp_path / 'out.jsonl'}}}}}]\n"
        "  supervision: {max_restarts: 2, within_seconds: 60, backoff: {base_ms: 1, max_ms: 5}}\n"
        f"  storage: {{type: sqlite, path: {tmp_path / 'cp.db'}}}\n"
    )
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--config", str(cfg), "--log-file", str(log), "--quiet") as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/health").status_code == 503, what="the pipeline to fail")
        assert serve.terminate() == 0
    records = lines(log)
    restarts = [r for r in records if r["event"] == "child_restarted" and r["actor"] == "SourceReader"]
    assert restarts, records
    for r in restarts:
        assert r["exception"].startswith("Traceback (most recent call last):")
        assert "file is not a database" in r["exception"] and "_connect" in r["exception"]
    escalations = [r for r in records if r["event"] == "supervisor_escalated"]
    assert escalations and escalations[0]["supervisor"] == "PipelineSupervisor[crashy]"
    assert "The above exception was the direct cause" in escalations[0]["exception"]
    assert "file is not a database" in escalations[0]["exception"]


def test_a_file_sink_given_a_folder_stops_the_pipeline_saying_so(tmp_path: Path) -> None:
    """Its path names a folder: no wait makes it a file, so it is not waited for as a write that
    fails is (``test_file_sink``): the batch is abandoned, as for bad credentials, and the
    pipeline fails at once saying what to change, not ``IsADirectoryError``, and not after
    restarting until its restart intensity ran out (half a minute of tracebacks, before). Once
    the folder is gone, ``POST /pipelines/{name}/resume`` starts it again, and it writes."""
    (tmp_path / "out.jsonl").mkdir()
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: folder}\nspec:\n"
        f"  source: {{type: turso, config: {{id: s, path: {tmp_path / 'src.db'}, workload: {{rows_per_second: 50}}}}}}\n"
        f"  sinks: [{{type: file, config: {{id: f, path: {tmp_path / 'out.jsonl'}}}}}]\n"
        f"  storage: {{type: sqlite, path: {tmp_path / 'cp.db'}}}\n"
    )
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--config", str(cfg), "--log-file", str(log), "--quiet") as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/health").status_code == 503, what="the pipeline to fail")
        [reason] = serve.get("/health").json()["reasons"]
        assert f"file sink 'f': {tmp_path / 'out.jsonl'} is a folder; path names the file to write" in reason
        (tmp_path / "out.jsonl").rmdir()
        resumed = httpx.post(serve.url("/pipelines/folder/resume"), timeout=10)
        assert resumed.status_code == 200 and resumed.json()["state"] in ("starting", "running"), resumed.text
        wait_until_sync(lambda: (tmp_path / "out.jsonl").is_file() and (tmp_path / "out.jsonl").stat().st_size > 0,
                        what="changes written once the path names a file")  # fmt: skip
        assert serve.get("/health").status_code == 200
        assert serve.terminate() == 0
    records = lines(log)
    assert [r for r in records if r["event"] == "child_restarted"] == []
    [failed] = [r for r in records if r["event"] == "pipeline_failed"]
    assert failed["reason"].startswith("sink 'f': file sink 'f': ") and reason.endswith(failed["reason"])


def test_what_libraries_log_is_json_lines_too(tmp_path: Path) -> None:
    """librdkafka calling a broker that is not there, and uvicorn sent a request that is not
    HTTP: their complaints are JSON lines with the library as actor; stderr holds nothing but
    JSON lines (a metrics port in use is refused by serve itself, as a JSON line too)."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: nobroker}\nspec:\n"
        f"  source: {{type: turso, config: {{id: s, path: {tmp_path / 'src.db'}, workload: {{rows_per_second: 50}}}}}}\n"
        f"  sinks: [{{type: kafka, config: {{id: k, brokers: '127.0.0.1:{free_port()}', topic: t, timeout_s: 2}}}}]\n"
        f"  storage: {{type: sqlite, path: {tmp_path / 'cp.db'}}}\n"
    )  # fmt: skip
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--config", str(cfg), "--log-file", str(log), "--metrics-addr",
               f"127.0.0.1:{busy.getsockname()[1]}", api=False) as serve:  # fmt: skip
        assert serve.proc.wait(30) == 2  # the metrics port is taken: serve stops, saying why
    with Serve(tmp_path, "--config", str(cfg), "--log-file", str(log)) as serve:
        serve.wait_api()
        with socket.create_connection(("127.0.0.1", serve.port)) as garbage:
            garbage.sendall(b"\x16\x03\x01 not http\r\n\r\n")
            garbage.recv(1024)  # uvicorn's 400
        wait_until_sync(lambda: any(r.get("actor") == "librdkafka" for r in lines(log)), timeout=60,
                        what="librdkafka's complaint as a JSON line")  # fmt: skip
        serve.kill()  # a drain would wait for the broker (30 s)
    busy.close()
    records = lines(log)
    [kafka, *_] = [r for r in records if r.get("actor") == "librdkafka"]
    assert kafka["event"] == "library_error" and "deltaforge-nobroker-k" in kafka["message"]
    [web] = [r for r in records if r.get("actor", "").startswith("uvicorn")]
    assert web["event"] == "library_warning" and "Invalid HTTP request" in web["message"]
    assert [r["event"] for r in records if r.get("event") == "api_failed"] == ["api_failed"]
    stderr = (tmp_path / "serve.err").read_text().splitlines()
    assert stderr and all(line.startswith("{") for line in stderr), [
        x for x in stderr if not x.startswith("{")
    ][:5]


SIGHUP_AS_A_TERMINAL_LEAVES_IT = (
    sys.executable, "-c",
    "import runpy, signal; signal.signal(signal.SIGHUP, signal.SIG_DFL); runpy.run_module('deltaforge', run_name='__main__')",
)  # fmt: skip
"""``python -m deltaforge`` with SIGHUP's default action, whatever this test run inherited (a run
under ``nohup`` would pass serve SIGHUP ignored, which serve then respects)."""


def test_a_closed_terminal_sighup_drains_and_stops_serve_as_sigterm_does(tmp_path: Path) -> None:
    """A terminal closed under ``serve`` (an SSH session that ended) sends SIGHUP, which killed it
    outright: no drain, no ``shutdown_complete``, exit -1."""
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--log-file", str(log), launcher=SIGHUP_AS_A_TERMINAL_LEAVES_IT) as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/pipelines/demo").json()["counters"]["batches_committed"] > 0,
                        what="a batch committed")  # fmt: skip
        serve.proc.send_signal(signal.SIGHUP)
        assert serve.proc.wait(30) == 0
    events = [r["event"] for r in lines(log)]
    assert "pipeline_drained" in events and events[-1] == "shutdown_complete"
    assert [r["signal"] for r in lines(log) if r["event"] == "shutdown_requested"] == ["SIGHUP"]


def test_serve_under_nohup_goes_on_through_a_sighup(tmp_path: Path) -> None:
    """``nohup`` starts it with SIGHUP ignored, and its user means it to outlive the terminal: a
    handler installed regardless would undo that, stopping it at logout."""
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--no-workload", "--log-file", str(log), launcher=("nohup", *PYTHON_M)) as serve:
        serve.wait_api()
        serve.proc.send_signal(signal.SIGHUP)
        serve.proc.send_signal(signal.SIGUSR1)  # answered after the SIGHUP, which would stop it
        wait_until_sync(lambda: any(r["event"] == "waiting_on" for r in lines(log)), what="SIGUSR1's answer")
        assert serve.get("/health").json()["status"] == "ok"
        assert serve.terminate() == 0
    assert [r["signal"] for r in lines(log) if r["event"] == "shutdown_requested"] == ["SIGTERM"]


def test_a_second_signal_stops_at_once_while_the_drain_waits_on_a_sink_that_is_down(tmp_path: Path) -> None:
    """The first SIGTERM drains, which waits (up to 30 s) for a sink that is down; a second one
    stops without delivering what is buffered, saying so, and exits 0."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: stuck}\nspec:\n"
        f"  source: {{type: turso, config: {{id: s, path: {tmp_path / 'src.db'}, workload: {{rows_per_second: 50}}}}}}\n"
        f"  sinks: [{{type: redis, config: {{id: r, uri: 'redis://127.0.0.1:{free_port()}', stream: s}}}}]\n"
        f"  storage: {{type: sqlite, path: {tmp_path / 'cp.db'}}}\n"
    )  # fmt: skip
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--config", str(cfg), "--log-file", str(log)) as serve:
        serve.wait_api()

        def waiting_on_the_sink() -> bool:
            body = serve.get("/health").json()
            return body["status"] == "degraded" and "sink:r" in body["unavailable"].get("stuck", {})

        wait_until_sync(waiting_on_the_sink, timeout=60, what="the sink listed unavailable")
        serve.proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: any(r["event"] == "shutdown_requested" for r in lines(log)), timeout=30,
                        what="the drain begun")  # fmt: skip
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(20) == 0  # well inside the drain's own 30 s
    events = [r["event"] for r in lines(log)]
    assert "drain_skipped" in events and events[-1] == "shutdown_complete"
    assert "pipeline_drained" not in events
    held = subprocess.run([sys.executable, "-m", "deltaforge", "checkpoints", "--storage-path", str(tmp_path / "cp.db")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert held.returncode == 0 and "stuck::sink::r" not in held.stdout  # nothing delivered, none moved


def test_processors_without_the_spark_extra_stop_at_start_with_what_to_install(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "pyspark"  # pyspark as it is on a machine without the extra
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pyspark'\")\n")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: sparkless}\nspec:\n"
        f"  source: {{type: turso, config: {{id: s, path: {tmp_path / 'src.db'}}}}}\n"
        "  processors: [{type: filter, expr: \"op = 'c'\"}]\n"
        f"  sinks: [{{type: file, config: {{id: f, path: {tmp_path / 'out.jsonl'}}}}}]\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "serve", "--config", str(cfg), "--api-addr", "off", "--quiet"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "shadow")},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert (
        "pipeline 'sparkless': processors need the spark extra: pip install 'deltaforge[spark]' "
        "(and a Java 17 runtime)" in r.stderr
    )
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("flag", "addr"), [("--api-addr", "notanaddr"), ("--api-addr", "127.0.0.1:99999"),
                                            ("--metrics-addr", "127.0.0.1:8o80")])  # fmt: skip
def test_a_listen_address_that_is_not_one_stops_serve_with_exit_2_saying_why(flag: str, addr: str) -> None:
    """``notanaddr`` was a ValueError traceback; port 99999 listened on 34463 (the resolver takes
    it modulo 65536) while the log said 99999."""
    r = subprocess.run([sys.executable, "-m", "deltaforge", "serve", flag, addr], capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.endswith(
        f"error: argument {flag}: expected host:port with a port from 0 to 65535, got {addr!r}\n"
    ), r.stderr


@pytest.mark.parametrize(("args", "flag"), [
    (["serve", "--api-token-file", "{missing}"], "--api-token-file"),
    (["schema", "-o", "{missing}"], "--output"),
    (["pipelines", "create", "-f", "{missing}"], "--file"),
    (["pipelines", "list", "--token-file", "{missing}"], "--token-file"),
    (["snapshot", "p", "t", "--token-file", "{missing}"], "--token-file"),
])  # fmt: skip
def test_a_file_named_on_the_command_line_that_is_not_there_is_said_not_a_traceback(
    tmp_path: Path, args: list[str], flag: str
) -> None:
    missing = str(tmp_path / "no" / "such.file")
    r = subprocess.run([sys.executable, "-m", "deltaforge", *(a.format(missing=missing) for a in args)],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 1
    assert r.stderr == f"deltaforge: {flag} {missing}: No such file or directory\n", r.stderr


def test_a_token_file_is_read_for_its_first_line(tmp_path: Path) -> None:
    """A token file with a second line (when the token was rotated) made its whole text the token,
    newline included: no request could match it, and every change was refused (401)."""
    token = tmp_path / "token"
    token.write_text("t0ken\nrotated on 5 Dec\n")
    with Serve(tmp_path, "--no-workload", "--api-token-file", str(token)) as serve:
        serve.wait_api()
        paused = subprocess.run([sys.executable, "-m", "deltaforge", "pipelines", "pause", "demo", "--api",
                                 serve.url(""), "--token-file", str(token)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert paused.returncode == 0, paused.stdout + paused.stderr
        assert serve.get("/pipelines/demo").json()["state"] == "paused"
        assert httpx.post(
            serve.url("/pipelines/demo/resume"), headers={"Authorization": "Bearer t0ken"}
        ).is_success
        assert serve.terminate() == 0


def test_an_api_address_in_use_stops_serve_with_exit_2_saying_why(tmp_path: Path) -> None:
    """When the API cannot listen, serve says so and exits 2 (it exited 3 from inside uvicorn,
    without the message), before any pipeline starts: the address is bound first."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "deltaforge", "serve", "--api-addr", f"127.0.0.1:{port}",
             "--log-file", str(tmp_path / "log.jsonl")],
            cwd=tmp_path, capture_output=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    events = jsonl(tmp_path / "log.jsonl")
    failed = [d["reason"] for d in events if d.get("event") == "api_failed"]
    assert failed == [f"cannot serve the REST API on 127.0.0.1:{port}: Address already in use"]
    assert not [d for d in events if d.get("event") == "pipeline_started"]


def test_standard_output_closed_by_its_reader_gives_up_the_console_sink_and_the_rest_goes_on(
    tmp_path: Path,
) -> None:
    """``serve | head -3``: once ``head`` has its lines and exits, every write to standard output
    fails with EPIPE, which no retry fixes. The optional console sink is given up for this run,
    saying why, the file sink goes on, and serve still stops cleanly (no BrokenPipeError at exit).
    Before, each write crashed the console sink's worker, then the coordinator: the pipeline
    restarted whole until it failed, the file sink with it."""
    log, events = tmp_path / "log.jsonl", tmp_path / "data" / "events.jsonl"
    port = free_port()
    with open(tmp_path / "serve.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltaforge", "serve", "--api-addr", f"127.0.0.1:{port}", "--log-file", str(log)],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            head = [proc.stdout.readline() for _ in range(3)]
            proc.stdout.close()  # what head does once it has its lines
            assert all(b"demo.orders" in line for line in head)

            def given_up() -> list[dict[str, object]]:
                return [r for r in lines(log) if r["event"] == "sink_lagging" and r.get("sink") == "console"]

            wait_until_sync(lambda: bool(given_up()), timeout=30, what="the console sink given up")
            held = len(lines(events))
            wait_until_sync(
                lambda: len(lines(events)) >= held + 20, timeout=30, what="the file sink going on"
            )
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    said = given_up()
    assert len(said) == 1 and "standard output is closed" in str(said[0]["reason"]), said
    assert health["pipelines"] == {"demo": "running"}
    records = lines(log)
    assert not [r for r in records if r["event"] in ("child_restarted", "pipeline_failed")]
    assert rc == 0 and records[-1]["event"] == "shutdown_complete"
    assert b"BrokenPipe" not in (tmp_path / "serve.err").read_bytes()  # nothing said at exit about it


def test_sigusr1_logs_what_every_task_and_thread_waits_on_and_serve_goes_on(tmp_path: Path) -> None:
    """A pipeline standing still with ``/health`` ok showed nothing of where: py-spy sees the
    event loop's thread in ``select`` only. SIGUSR1 logs every task's chain of awaits (named by
    its supervisor) and every thread's stack, and serve runs on."""
    log = tmp_path / "data" / "deltaforge.log"
    with Serve(tmp_path, "--no-workload", "--log-file", "data/deltaforge.log") as serve:
        serve.wait_api()
        serve.wait_source_open("demo")
        serve.proc.send_signal(signal.SIGUSR1)
        wait_until_sync(
            lambda: any(r["event"] == "waiting_on" for r in lines(log)), timeout=30, what="waiting_on said"
        )
        assert serve.get("/health").json()["status"] == "ok"
        assert serve.terminate() == 0
    [said] = [r for r in lines(log) if r["event"] == "waiting_on"]
    tasks = {t["task"]: t["awaits"] for t in said["tasks"]}
    reader = tasks["PipelineSupervisor[demo]/SourceReader"]
    assert reader[0].startswith("supervision.supervisor:") and reader[0].endswith(" Supervisor._watch")
    assert any(a.endswith(" SourceReader.receive") for a in reader), reader
    assert any(name.endswith("/DeliveryWorker[events-file]") for name in tasks)
    assert said["threads"]["MainThread"][-1].endswith(" stacks")  # the handler's own frame, innermost
    shown = subprocess.run(
        [sys.executable, "-m", "deltaforge", "logs", str(log)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    at = shown.index("  task PipelineSupervisor[demo]/SourceReader")  # one await a line under its task
    assert shown[at + 1 : at + 1 + len(reader)] == [f"    {a}" for a in reader]
    assert "  thread MainThread" in shown


def test_the_cli_asks_about_a_pipeline_whose_name_a_url_would_cut(tmp_path: Path) -> None:
    """``deltaforge pipelines get 'orders #2'`` put the name into the URL as it was: ``#2`` was
    taken for a fragment and the API was asked about ``orders``. A '/' cannot be a name's at all
    (``test_config``)."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "apiVersion: deltaforge/v1\nkind: Pipeline\nmetadata: {name: 'orders #2?'}\nspec:\n"
        f"  source: {{type: turso, config: {{id: s, path: {tmp_path / 'src.db'}}}}}\n"
        f"  sinks: [{{type: file, config: {{id: f, path: {tmp_path / 'events.jsonl'}}}}}]\n"
        f"  storage: {{type: sqlite, path: {tmp_path / 'cp.db'}}}\n"
    )
    with Serve(tmp_path, "--config", str(cfg)) as serve:
        serve.wait_api()
        got = subprocess.run([sys.executable, "-m", "deltaforge", "pipelines", "get", "orders #2?", "--api",
                              serve.url("")], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert got.returncode == 0, got.stdout + got.stderr
        assert '"name": "orders #2?"' in got.stdout
        assert serve.terminate() == 0
