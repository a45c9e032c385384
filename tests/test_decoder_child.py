"""A decoder child's own output: its libraries' warnings and its crashes reach the service's log
as JSON events with the pipeline's name, and an exit says why the child ended. Children started
ahead (``serve`` starts them before its pipelines) are taken by the first decoders of their module."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from deltaforge.sources import childframes, childproc
from deltaforge.sources.base import SourceError
from deltaforge.sources.childproc import ChildDecoder

PROBE = "tests.decoder_probe"


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as captured:
        yield captured


def run_probe(then: str, frames: tuple[tuple[Any, ...], ...] = (("said",),)) -> BaseException:
    """The probe child's frames until it ends (``frames``): what the pump reports then."""
    seen: list[tuple[Any, ...]] = []
    structlog.contextvars.bind_contextvars(pipeline="orders")
    try:
        decoder = ChildDecoder("probe source 'p'", PROBE, lambda f: seen.append(f) or None, silence_s=60)
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


def test_a_child_gone_with_a_frame_left_unsent_is_stopped_and_reaped() -> None:
    """A frame sent to a child that had exited stays in its stdin's buffer (the write's broken
    pipe is the pump's to report), and closing that pipe raised ``BrokenPipeError`` from the
    decoder's stop: the child was not reaped, its pipes not closed, its threads not joined, and
    the PostgreSQL source's close stopped there, its control connection and checks left open
    (``on_stop_failed``, seen when ``serve`` went on after a pause longer than the server's
    ``wal_sender_timeout``)."""
    decoder = ChildDecoder("probe source 'p'", PROBE, lambda f: None, silence_s=60)
    decoder.start({"then": "exit"})
    assert isinstance(decoder.queue.get(timeout=30), BaseException)  # the child has ended
    proc = decoder._proc
    assert proc is not None and proc.stdin is not None
    decoder.send(("confirm", 1))
    decoder.stop()
    assert (
        proc.returncode is not None and proc.stdin.closed and proc.stdout is not None and proc.stdout.closed
    )


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


def test_a_library_line_the_child_says_again_and_again_is_logged_once(logs: list[dict[str, Any]]) -> None:
    """The child's library lines are held back as serve's own are (``logrepeats``): the first of
    a kind is logged, its repeats within a minute counted for the next one logged after it."""
    run_probe("repeat")
    said = [e for e in logs if e["event"] == "library_error"]
    assert [e["message"] for e in said] == ["connect to port 9092 failed"]
    assert said[0]["actor"] == "some.library" and "repeated" not in said[0]


@pytest.mark.parametrize("signal_name", ["sigint", "sighup"])
def test_a_ctrl_c_or_a_closed_terminal_reaches_the_parent_not_the_decoder(signal_name: str) -> None:
    """Ctrl-C signals the whole process group, and so does a closed terminal (SIGHUP); the
    decoder goes on until its parent, draining, stops it: a KeyboardInterrupt would end it
    mid-stream with an error, and SIGHUP ended it before the drain."""
    ended = run_probe(signal_name, frames=(("said",), ("still here",)))
    assert str(ended).endswith("decoder process exited (code 0)")


@pytest.fixture
def prestarted() -> Iterator[None]:
    yield
    childproc.discard_prestarted()


def probe_pid() -> int:
    """The process id a new probe decoder runs in (the probe says it, then exits)."""
    seen: list[tuple[Any, ...]] = []
    decoder = ChildDecoder("probe source 'p'", PROBE, lambda f: seen.append(f) or None, silence_s=60)
    decoder.start({"then": "pid"})
    try:
        ended = decoder.queue.get(timeout=30)
    finally:
        decoder.stop()
    assert isinstance(ended, SourceError), ended
    assert seen[0] == ("said",) and seen[1][0] == "pid"
    return int(seen[1][1])


def test_the_first_decoder_of_a_module_runs_in_the_child_started_ahead(prestarted: None) -> None:
    ahead = childproc.prestart(PROBE)
    assert probe_pid() == ahead[0]
    assert probe_pid() not in ahead  # only one was started ahead: the next decoder starts its own


def test_a_child_started_ahead_that_died_is_replaced(prestarted: None) -> None:
    (dead,) = childproc.prestart(PROBE)
    os.kill(dead, signal.SIGKILL)
    os.waitid(os.P_PID, dead, os.WEXITED | os.WNOWAIT)  # until it has died, left for its owner to reap
    assert probe_pid() != dead


def test_children_no_decoder_took_are_stopped_and_reaped(prestarted: None) -> None:
    ahead = childproc.prestart(PROBE, 2)
    childproc.discard_prestarted()
    for pid in ahead:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left behind
    assert probe_pid() not in ahead


def test_a_child_writes_a_frame_of_900_kb_without_waiting_for_the_parent_to_read() -> None:
    """A backlog's frames (a 1,000-change transaction with its Kafka records: about 500 kB) are
    larger than the kernel's default 64 KiB pipe: the child waited at each 64 KiB for serve's reader. Its
    output pipe holds 1 MiB: here nothing reads until the child has written 900 kB and exited."""
    proc = childproc._popen(PROBE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        childframes.write_frame(proc.stdin, {"then": "big"})
        assert proc.wait(timeout=30) == 0  # with 64 KiB it waits here, blocked in its write
        frames: list[Any] = []
        with contextlib.suppress(EOFError):
            while True:
                frames.append(childframes.read_frame(proc.stdout))
        assert [f for f in frames if f != childframes.ALIVE] == [("said",), ("big", b"x" * 900_000)]
    finally:
        childproc._kill(proc)
        childproc._close_pipes(proc)


def test_a_frame_damaged_in_transit_is_refused_not_unpickled() -> None:
    """A frame carries its pickle's CRC-32. One whose bytes changed on the way, however valid the
    pickle still is, is refused: here a value changes from 'row-360007' to 'row-360008'."""
    import io

    out = io.BytesIO()
    childframes.write_frame(out, ("txs", [("c", "bench", "narrow", {"b": "row-360007"})]))
    sent = out.getvalue()
    assert childframes.read_frame(io.BytesIO(sent)) == (
        "txs",
        [("c", "bench", "narrow", {"b": "row-360007"})],
    )
    damaged = sent.replace(b"row-360007", b"row-360008")
    assert damaged != sent and pickle.loads(damaged[childframes.FRAME.size :])[1][0][3] == {"b": "row-360008"}
    with pytest.raises(childframes.FrameDamaged, match="damaged in transit"):
        childframes.read_frame(io.BytesIO(damaged))


def test_a_decoder_is_not_taken_for_stopped_when_this_process_was_the_one_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``serve`` itself SIGSTOPped past the silence bound (a paused VM) and resumed: its pump's
    pending read returns the pipe's bytes at once, and may wait for the GIL to say so while the
    reader looks for silence, finding the last frame old and the pipe empty. Staged here just
    after the pump has read an :data:`ALIVE` (the pipe empty for about a second): the last frame
    and the last look both twice the bound ago. Not stopped (before: named stopped, and
    ``serve`` restarted its source in the chaos scenario ``serve_paused``); a silence after it
    is still named."""
    monkeypatch.setattr(childproc, "SILENT_SLACK_S", 3.0)
    decoder = ChildDecoder("probe source 'p'", PROBE, lambda f: None, silence_s=0)
    decoder.start({"then": "idle"})
    try:
        assert decoder.next_chunk(10) == []
        heard = decoder._heard
        deadline = time.monotonic() + 10
        while decoder._heard == heard:  # the next ALIVE, read by the pump
            assert time.monotonic() < deadline, "no ALIVE from the child"
            time.sleep(0.001)
        decoder._heard = decoder._looked = time.monotonic() - 2 * decoder.silent_s
        assert decoder._stopped() is None
        assert decoder._proc is not None
        os.kill(decoder._proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while (got := decoder.next_chunk(10)) == []:
            assert time.monotonic() < deadline, "the stopped decoder was never named"
        assert isinstance(got, SourceError), got
    finally:
        decoder.stop()


def test_a_stopped_decoder_is_named_and_an_idle_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder process stopped (SIGSTOP, a cgroup freezer) or hung says nothing, and its source
    read nothing for ever with ``/health`` ok: no different, from the parent, from a stream on a
    quiet server. A decoder says it is alive every second from a thread of its own; one silent
    past its stream's silence bound (plus a slack, here 3 s) is an error naming it."""
    monkeypatch.setattr(childproc, "SILENT_SLACK_S", 3.0)
    seen: list[tuple[Any, ...]] = []
    decoder = ChildDecoder("probe source 'p'", PROBE, lambda f: seen.append(f) or None, silence_s=0)
    decoder.start({"then": "idle"})
    try:
        idle_until = time.monotonic() + 2 * decoder.silent_s
        while time.monotonic() < idle_until:  # idle past the bound twice over, yet alive
            assert decoder.next_chunk(10) == []
        assert decoder._proc is not None
        pid = decoder._proc.pid
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while (got := decoder.next_chunk(10)) == []:
            assert time.monotonic() < deadline, "the stopped decoder was never named"
    finally:
        decoder.stop()  # SIGKILL ends a stopped process too
    assert isinstance(got, SourceError), got
    assert str(got).startswith(f"probe source 'p': decoder process {pid} said nothing for 3 s"), got
    assert seen == [("said",)]  # the alive frames are the pump's own
