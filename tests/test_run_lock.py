"""One process at a time runs a pipeline on a checkpoint store: a second ``serve`` of the same
pipeline (a unit started twice, a second terminal) waits for the first to stop, then takes over."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import structlog

from deltaforge.pipeline.availability import Availability
from deltaforge.pipeline.runlock import RunLock
from supervision import FakeClock
from tests.helpers import file_size_limit, jsonl, wait_until, wait_until_sync
from tests.serve_proc import Serve


def _said(log: Path, event: str) -> list[dict[str, object]]:
    return [r for r in jsonl(log) if r["event"] == event]


def test_a_second_serve_of_a_running_pipeline_waits_for_the_first_then_takes_over(tmp_path: Path) -> None:
    """Two processes running one pipeline deliver every change twice, and their checkpoints race;
    a file sink of one cuts back, before a retry, what the other wrote after it. The second
    serve waits (``degraded``, naming the process that runs the pipeline) and delivers nothing
    until the first has stopped; then it goes on from the first one's checkpoints: every change
    once. Before, the second one ran the pipeline too (here the embedded Turso database's own
    lock stopped it, after restarts; a MariaDB or PostgreSQL source has no such lock)."""
    events = tmp_path / "data" / "events.jsonl"
    first_log, second_log = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    with Serve(tmp_path, "--log-file", str(first_log)) as first:
        first.wait_api()
        wait_until_sync(lambda: len(jsonl(events)) >= 20, timeout=30, what="the first serve delivering")
        with Serve(tmp_path, "--log-file", str(second_log)) as second:
            second.wait_api()
            wait_until_sync(lambda: bool(_said(second_log, "pipeline_held_elsewhere")), timeout=30,
                            what="the second serve waiting")  # fmt: skip
            body = second.get("/health").json()
            held = len(jsonl(events))
            wait_until_sync(lambda: len(jsonl(events)) >= held + 20, timeout=30, what="the first going on")
            assert not _said(second_log, "pipeline_started") and not _said(second_log, "source_opening")
            assert first.terminate() == 0
            wait_until_sync(lambda: bool(_said(second_log, "pipeline_started")), timeout=30,
                            what="the second taking over")  # fmt: skip
            held = len(jsonl(events))
            wait_until_sync(lambda: len(jsonl(events)) >= held + 20, timeout=30, what="the second delivering")
            assert second.get("/health").json()["status"] == "ok"
            assert second.terminate() == 0
    assert body["status"] == "degraded" and body["pipelines"] == {"demo": "degraded"}
    reason = body["unavailable"]["demo"]["run_lock"]["last_error"]
    assert f"pid {first.proc.pid}" in reason and "waiting for it to stop" in reason, reason
    [waiting] = _said(second_log, "pipeline_held_elsewhere")
    assert waiting["held_by"] == reason.split("(", 1)[1].split(")", 1)[0]
    ids = [e["event_id"] for e in jsonl(events)]
    assert len(ids) == len(set(ids))  # every change once: no two processes delivered it


def test_a_pipeline_whose_process_was_killed_is_taken_over_by_the_one_waiting(tmp_path: Path) -> None:
    """The hold is the kernel's (a lock on an open file): a process SIGKILLed lets go of it."""
    events = tmp_path / "data" / "events.jsonl"
    second_log = tmp_path / "second.jsonl"
    with Serve(tmp_path, "--log-file", str(tmp_path / "first.jsonl")) as first:
        first.wait_api()
        wait_until_sync(lambda: len(jsonl(events)) >= 20, timeout=30, what="the first serve delivering")
        with Serve(tmp_path, "--log-file", str(second_log)) as second:
            wait_until_sync(lambda: bool(_said(second_log, "pipeline_held_elsewhere")), timeout=30,
                            what="the second serve waiting")  # fmt: skip
            first.kill()
            wait_until_sync(lambda: bool(_said(second_log, "pipeline_started")), timeout=30,
                            what="the second taking over")  # fmt: skip
            held = len(jsonl(events))
            wait_until_sync(lambda: len(jsonl(events)) >= held + 20, timeout=30, what="the second delivering")
            assert second.terminate() == 0


def test_checkpoints_are_not_changed_under_a_running_pipeline(tmp_path: Path) -> None:
    """``deltaforge checkpoints --rollback`` or ``--forget`` while the pipeline runs: its next write
    would overwrite the change (a rollback undone without a word), so it is refused, naming the
    process to stop; once stopped, it is done."""
    store = str(tmp_path / "data" / "deltaforge.db")

    def checkpoints(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "deltaforge", "checkpoints", "--storage-path", store, *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    with Serve(tmp_path, "--log-file", str(tmp_path / "log.jsonl")) as serve:
        serve.wait_api()
        wait_until_sync(
            lambda: "demo::sink::console" in checkpoints().stdout, timeout=30, what="a checkpoint"
        )
        for args in (("--forget", "demo::sink::console"), ("--rollback", "demo::sink::console", "--to", "1")):
            refused = checkpoints(*args)
            assert refused.returncode == 1, refused
            assert f"pipeline 'demo' is running (pid {serve.proc.pid} on " in refused.stderr, refused.stderr
            assert "stop it first" in refused.stderr
        assert serve.terminate() == 0
    assert "demo::sink::console" in checkpoints().stdout  # nothing was changed
    done = checkpoints("--forget", "demo::sink::console")
    assert done.returncode == 0, done.stderr
    assert "demo::sink::console" not in checkpoints().stdout


def test_a_run_lock_whose_holder_cannot_be_written_down_is_held_all_the_same(tmp_path: Path) -> None:
    """On a full disk (here: no file may grow past 0 bytes) the lock is taken all the same: only the
    name of its holder is missing. Before, the write of the name failed the pipeline's start."""
    store = str(tmp_path / "cp.db")
    first = RunLock(store, "p")
    assert first.acquire()  # the file exists, with a holder's name in it
    first.release()
    with file_size_limit(0):
        lock = RunLock(store, "p")
        assert lock.acquire()
    assert not RunLock(store, "p").acquire() and RunLock(store, "p").holder() == "unknown"
    lock.release()
    assert RunLock(store, "p").acquire()


async def test_a_run_lock_file_that_cannot_be_made_is_waited_for(tmp_path: Path) -> None:
    """A lock file that cannot be opened (a full disk refusing a new file; here a directory in its
    place) is waited for as the store is: ``run_lock`` unavailable with the error, tried again,
    then taken. Before, the error failed the pipeline's start."""
    lock = RunLock(str(tmp_path / "cp.db"), "p")
    lock.path.mkdir()
    availability = Availability("p")
    waiting = asyncio.create_task(lock.wait(availability, FakeClock(), structlog.get_logger()))
    await wait_until(lambda: availability.degraded or waiting.done(), what="the lock waited for")
    assert not waiting.done(), waiting
    assert "IsADirectoryError" in availability.view()["run_lock"]["last_error"]
    lock.path.rmdir()
    await asyncio.wait_for(waiting, 10)
    assert not availability.degraded and not RunLock(str(tmp_path / "cp.db"), "p").acquire()
    lock.release()


def test_a_serve_waiting_for_the_run_lock_stops_at_once_when_asked(tmp_path: Path) -> None:
    """SIGTERM to a standby ends its wait (exit 0, nothing read), and the running one goes on."""
    events = tmp_path / "data" / "events.jsonl"
    second_log = tmp_path / "second.jsonl"
    with Serve(tmp_path, "--log-file", str(tmp_path / "first.jsonl")) as first:
        first.wait_api()
        with Serve(tmp_path, "--log-file", str(second_log)) as second:
            wait_until_sync(lambda: bool(_said(second_log, "pipeline_held_elsewhere")), timeout=30,
                            what="the second serve waiting")  # fmt: skip
            assert second.terminate(timeout=20) == 0
        assert [r["state"] for r in _said(second_log, "pipeline_stopped")] == ["stopped"]
        assert not _said(second_log, "source_opening")
        held = len(jsonl(events))
        wait_until_sync(lambda: len(jsonl(events)) >= held + 10, timeout=30, what="the first going on")
        assert first.terminate() == 0
