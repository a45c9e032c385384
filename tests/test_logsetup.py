"""Logging never takes the pipeline down: a log file on a full disk loses lines, and says so."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
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
