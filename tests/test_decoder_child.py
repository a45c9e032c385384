"""A decoder child's own output: its libraries' warnings and its crashes reach the service's log
as JSON events with the pipeline's name, and an exit says why the child ended."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from deltaforge.sources.base import SourceError
from deltaforge.sources.childproc import ChildDecoder


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as captured:
        yield captured


def run_probe(then: str, frames: tuple[tuple[Any, ...], ...] = (("said",),)) -> BaseException:
    """The probe child's frames until it ends (``frames``): what the pump reports then."""
    seen: list[tuple[Any, ...]] = []
    structlog.contextvars.bind_contextvars(pipeline="orders")
    try:
        decoder = ChildDecoder("probe source 'p'", "tests.decoder_probe", lambda f: seen.append(f) or None)
        decoder.start({"then": then})
    finally:
        structlog.contextvars.unbind_contextvars("pipeline")
    try:
        ended = decoder.queue.get(timeout=30)
    finally:
        decoder.stop()
    assert seen == list(frames)
    assert isinstance(ended, BaseException)
    return ended


def test_a_library_warning_in_the_child_is_one_log_event_with_the_pipeline(
    logs: list[dict[str, Any]],
) -> None:
    run_probe("exit")
    warning = next(e for e in logs if e["event"] == "library_warning")
    assert warning["actor"] == "some.library"
    assert warning["pipeline"] == "orders"
    assert warning["decoder"] == "probe source 'p'"
    assert warning["message"] == "first line, then an indented second"
    assert warning["log_level"] == "warning"


def test_a_crashed_child_logs_its_traceback_and_the_source_error_says_why(logs: list[dict[str, Any]]) -> None:
    ended = run_probe("crash")
    crash = next(e for e in logs if e["event"] == "library_error")
    assert crash["pipeline"] == "orders"
    assert crash["message"] == "RuntimeError: the probe crashed on purpose"
    assert 'in main\n    raise RuntimeError("the probe crashed on purpose")' in crash["exception"]
    assert isinstance(ended, SourceError)
    assert str(ended) == (
        "probe source 'p': decoder process exited (code 1): RuntimeError: the probe crashed on purpose"
    )


def test_bare_text_from_the_child_is_logged_line_by_line_and_named_at_exit(
    logs: list[dict[str, Any]],
) -> None:
    ended = run_probe("print")
    line = next(e for e in logs if e["event"] == "decoder_output")
    assert line["line"] == "Fatal Python error: the probe's last words"
    assert line["pipeline"] == "orders"
    assert str(ended).endswith("decoder process exited (code 3): Fatal Python error: the probe's last words")


def test_a_ctrl_c_reaches_the_parent_not_the_decoder() -> None:
    """Ctrl-C signals the whole process group; the decoder goes on until its parent, draining,
    stops it: a KeyboardInterrupt would end it mid-stream with an error."""
    ended = run_probe("sigint", frames=(("said",), ("still here",)))
    assert str(ended).endswith("decoder process exited (code 0)")
