"""Logging never takes the pipeline down: a log file on a full disk loses lines, and says so; a
library saying one thing again and again does not flood the log."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog
from confluent_kafka import Producer

from deltaforge import cli, logrepeats, logsetup
from deltaforge.logrepeats import LIBRARIES, log_library_line, say_overdue
from deltaforge.sinks.kafka_settings import LIBRDKAFKA_LOG
from tests.helpers import file_size_limit, wait_until
from tests.serve_proc import free_port


def test_a_log_file_that_cannot_be_written_loses_lines_not_the_caller(tmp_path: Path) -> None:
    """Before: the log call raised the disk's OSError, so whichever actor logged crashed, and the
    supervisor's log of its restart raised too."""
    path = tmp_path / "log.jsonl"
    logsetup.configure("info", path, stderr=False)
    try:
        log = structlog.get_logger().bind(actor="test")
        log.info("before")
        with file_size_limit(path.stat().st_size):  # no room for another byte
            log.info("lost", n=1)
            log.warning("lost", n=2)
        log.info("after")
    finally:
        logsetup.configure("info")  # as conftest has it
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]  # each a whole JSON line
    assert [d["event"] for d in lines] == ["before", "log_lines_lost", "after"]
    assert lines[1]["count"] == 2 and lines[1]["reason"] == "OSError: [Errno 27] File too large"


def test_a_line_cut_short_by_a_full_disk_is_ended_before_the_next(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    logsetup.configure("info", path, stderr=False)
    try:
        log = structlog.get_logger().bind(actor="test")
        log.info("before")
        with file_size_limit(path.stat().st_size + 20):  # room for part of the next line only
            log.info("cut", padding="x" * 200)
        log.info("after")
    finally:
        logsetup.configure("info")
    raw = path.read_bytes().splitlines()
    assert orjson.loads(raw[0])["event"] == "before" and len(raw[1]) == 20  # the torn part, alone
    assert [orjson.loads(line)["event"] for line in raw[2:]] == ["log_lines_lost", "after"]


def test_a_log_file_rotated_away_is_followed_by_a_new_one_at_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """logrotate renames the file (or it is removed): ``serve`` went on writing to the renamed
    one, and ``deltaforge logs`` on the path saw nothing more. The path is looked at again at
    most every second (here at every line) and opened again when it names another file."""
    monkeypatch.setattr(logsetup._LogFile, "check_every_s", 0.0)
    path = tmp_path / "log.jsonl"
    logsetup.configure("info", path, stderr=False)
    try:
        log = structlog.get_logger().bind(actor="test")
        log.info("before")
        path.rename(tmp_path / "log.jsonl.1")
        log.info("after rotation")
        rotated = (tmp_path / "log.jsonl.1").read_bytes()
        path.unlink()
        log.info("after removal")
    finally:
        logsetup.configure("info")
    assert [orjson.loads(line)["event"] for line in rotated.splitlines()] == ["before"]
    assert [orjson.loads(line)["event"] for line in path.read_bytes().splitlines()] == ["after removal"]


def test_logs_following_a_file_goes_on_in_the_new_one_after_a_rotation(tmp_path: Path) -> None:
    """``deltaforge logs -f`` read on in the renamed file, which ``serve`` no longer writes (as
    ``tail -f``, not ``tail -F``): the lines of the new file never showed. At the old file's end
    the path is looked at again, and the new file read from its start."""
    from deltaforge.logview import follow

    path = tmp_path / "log.jsonl"
    path.write_text("one\n")
    lines = follow(path.open(), keep_following=True, path=str(path))
    assert next(lines) == "one\n"
    with path.open("a") as f:
        f.write("two\n")  # before the rotation, in the old file: read too
    path.rename(tmp_path / "log.jsonl.1")
    path.write_text("three\n")
    assert [next(lines), next(lines)] == ["two\n", "three\n"]
    lines.close()


def test_a_library_line_said_again_and_again_is_logged_once_a_minute_with_a_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka logs a FAIL line at every reconnect to a broker that is down, 3 to 5 a second for
    as long as it is down: on 5 Dec 188 lines of a 20-second outage's log of 202. The first of
    a kind is logged; its repeats within a minute are held back and counted, and the next one
    after the minute says how many (``repeated``). Real librdkafka, a port nobody listens on."""
    now = [0.0]
    monkeypatch.setattr(LIBRARIES, "clock", lambda: now[0])
    path = tmp_path / "log.jsonl"
    logsetup.configure("info", path, stderr=False)
    said: list[str] = []  # every line librdkafka says, before deltaforge's handler sees it

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    heard = Said()
    LIBRDKAFKA_LOG.addHandler(heard)
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{free_port()}", "logger": LIBRDKAFKA_LOG,
                         "log_level": 3, "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 10})  # fmt: skip

    def refusals() -> list[str]:
        first = next((m for m in said if "Connection refused" in m), None)
        return [] if first is None else [m for m in said if _kind(m) == _kind(first)]

    def hear(until: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not until():
            assert time.monotonic() < deadline, said[-5:]
            producer.poll(0.05)  # librdkafka's log lines are handed over here, in this thread

    try:
        producer.produce("t", b"x")
        hear(lambda: len(refusals()) >= 10)
        logged = [
            r for r in _lines(path) if r.get("actor") == "librdkafka" and "Connection refused" in r["message"]
        ]
        assert len(logged) == 1 and "repeated" not in logged[0], logged
        assert logged[0]["event"] == "library_error" and logged[0]["message"] == refusals()[0]
        held = len(refusals()) - 1
        now[0] += 61  # a minute on: the next refusal is logged, with the count of those held back
        hear(lambda: len(refusals()) > held + 1)
        logged = [
            r for r in _lines(path) if r.get("actor") == "librdkafka" and "Connection refused" in r["message"]
        ]
        assert [r.get("repeated") for r in logged] == [None, held]
        assert logged[1]["message"] == refusals()[held + 1]
    finally:
        LIBRDKAFKA_LOG.removeHandler(heard)
        producer.purge()
        producer.flush(0)
        logsetup.configure("info")


async def test_repeats_no_later_line_reports_are_said_once_their_minute_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker down for 20 s: its first refusal logged, the rest held back and counted for the
    next one logged after the minute, which never came (the broker was back). The count was
    never said: the log showed one refusal for eighty. Serve now says such counts once their
    minute is over (every ``REPEATS_EVERY_S``), with the last line held back; and those still
    held when it ends, as it ends."""
    now = [0.0]
    monkeypatch.setattr(LIBRARIES, "clock", lambda: now[0])
    monkeypatch.setattr(cli, "REPEATS_EVERY_S", 0.0)
    path = tmp_path / "log.jsonl"
    logsetup.configure("info", path, stderr=False)
    log = structlog.get_logger()
    refused = [
        f"127.0.0.1:{port}/bootstrap: Connect to 127.0.0.1:{port} failed" for port in range(9092, 9096)
    ]
    try:
        for message in refused[:3]:
            log_library_line(log, "librdkafka", True, message=message)
        now[0] = 59.9
        say_overdue(log)  # its minute not over yet
        assert [r["message"] for r in _lines(path)] == refused[:1]
        now[0] = 60.0
        looking = asyncio.create_task(cli._say_library_repeats())
        try:
            await wait_until(lambda: len(_lines(path)) == 2, what="the held-back count said")
        finally:
            looking.cancel()
        said = _lines(path)[1]
        assert (said["event"], said["actor"], said["message"], said["repeated"]) == (
            "library_error",
            "librdkafka",
            refused[2],
            2,
        )
        now[0] = 61.0  # said at 60: held back again for a minute, and said as serve ends
        log_library_line(log, "librdkafka", True, message=refused[3])
        assert len(_lines(path)) == 2
        say_overdue(log, everything=True)
        assert [(r["message"], r.get("repeated")) for r in _lines(path)][2:] == [(refused[3], 1)]
    finally:
        logsetup.configure("info")


def _kind(message: str) -> str:
    return logrepeats.without_numbers(message)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_repeats_are_counted_per_kind_and_the_oldest_kinds_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind is the logger, the level and the message without its numbers; kinds past the most
    remembered are forgotten oldest first (logged again at their next saying)."""
    monkeypatch.setattr(logrepeats, "MOST_KINDS", 2)
    now = [0.0]
    r = logrepeats.Repeats(60.0, lambda: now[0])
    assert r.admit("kafka", "error", "port 1 refused") == 0
    assert r.admit("kafka", "error", "port 2 refused") is None  # the same kind
    assert r.admit("kafka", "warning", "port 2 refused") == 0  # another level
    assert r.admit("nats", "error", "port 2 refused") == 0  # another logger: kafka/error forgotten
    assert r.admit("kafka", "error", "port 3 refused") == 0  # as if never seen
    now[0] = 59.9
    assert r.admit("kafka", "error", "port 4 refused") is None
    now[0] = 60.0
    assert r.admit("kafka", "error", "port 5 refused") == 1
    r.forget()
    assert r.admit("kafka", "error", "port 6 refused") == 0


def test_a_python_warning_is_a_json_line_too(tmp_path: Path) -> None:
    """aiomysql passes a server's warnings on with ``warnings.warn``, which Python printed as bare
    text on stderr, over two lines (where, then the source line), among ``serve``'s JSON lines."""
    script = tmp_path / "warns.py"
    script.write_text(
        "import warnings\nfrom deltaforge import logsetup\nlogsetup.configure('info')\n"
        "warnings.warn(\"Table 'signal' already exists\", Warning)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    docs = [orjson.loads(line) for line in done.stderr.splitlines()]  # each line JSON, or this fails
    [doc] = docs
    assert doc["event"] == "library_warning" and doc["actor"] == "py.warnings", doc
    assert doc["message"] == f"{script}:4: Warning: Table 'signal' already exists", doc
