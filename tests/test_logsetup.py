"""Logging never takes the pipeline down: a log file on a full disk loses lines, and says so."""

from __future__ import annotations

from pathlib import Path

import orjson
import structlog

from deltaforge import logsetup
from tests.helpers import file_size_limit


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
