"""Decoding in a child process: framing, spawning, and the pump that feeds a source.

Pure-Python decoding (binlog rows, pgoutput) is the most expensive step of a
database source. In a thread it competes with the event loop for the one GIL;
in a child process it runs on its own core. The parent sends the settings as
the first frame on stdin (so passwords never show in a process listing), may
send more frames later (:meth:`ChildDecoder.send`, e.g. what sinks now hold
durably), and reads length-prefixed, checksummed pickled frames from stdout. A full queue stops the pump, the
pipe fills, the child blocks: backpressure reaches the database connection.
The child dies with its parent (``PR_SET_PDEATHSIG``), so a SIGKILLed service
leaves no decoder behind. What the child logs (its libraries' warnings, a crash's
traceback) goes as one JSON object per line on its stderr; the parent logs each as its own
event, so it reaches ``deltaforge logs`` and the log file, not bare text on a terminal.
This module is the parent's side; the child's (its setup, its log lines, its alive beat) is
``childside.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from deltaforge.logrepeats import log_library_line
from deltaforge.sources.childframes import AHEAD, ALIVE, read_frame, write_frame

if TYPE_CHECKING:  # serve imports this module first of all (earlystart.py): nothing heavy at import
    from deltaforge.events import Event

SILENT_SLACK_S = 10.0
"""How much longer than its stream's own silence bound a decoder process may say nothing before
it is taken for stopped (its main thread blocks at most that bound; this covers scheduling)."""
UNWATCHED_S = 5.0
"""A look for the child's silence this long after the one before finds this process paused
(a VM, a laptop's lid, SIGSTOP) or its reader held: the child's silence is counted from then."""


Handler = Callable[[tuple[Any, ...]], "list[Event] | None"]

DECODERS = {"mysql": "deltaforge.sources.mysql.decoder", "postgres": "deltaforge.sources.postgres.decoder"}
"""The decoder child module of each source type that has one (``plugins.py`` registers them from
here; ``earlystart.py`` reads them before the registry is imported)."""

_started: dict[str, list[subprocess.Popen[bytes]]] = {}
"""Children started ahead of their decoders (:func:`prestart`), by module, not yet taken."""


PIPE_BYTES = 1 << 20
"""What the kernel holds of a child's frames before the child's write waits for ``serve`` to read
(Linux's default: 64 KiB). A backlog's frame, one source transaction of 1,000 changes with their
Kafka records, is about 500 kB: the child waited at each 64 KiB of it for ``serve``'s
reader to be scheduled, and decoded nothing meanwhile (docs/performance.md)."""


def _popen(module: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=1 << 20,
    )
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux's alone
    if proc.stdout is not None and set_size is not None:
        # Refused above /proc/sys/fs/pipe-max-size (1 MiB unless lowered) or past the user's pipe
        # quota: the default stays, only slower.
        with contextlib.suppress(OSError):
            fcntl.fcntl(proc.stdout.fileno(), set_size, PIPE_BYTES)
    return proc


def prestart(module: str, count: int = 1) -> list[int]:
    """Start ``count`` children of ``module`` now, for decoders about to be made: the first
    :class:`ChildDecoder` objects of that module take them instead of starting their own.

    ``serve`` calls it as soon as its configs are read. A child's start-up (Python and its
    libraries, about 100 ms) then runs beside the rest of ``serve``'s (the checkpoint store, the
    actors, the source's checks) instead of after it, on the way to the first event after a
    restart. Call from the main thread (see
    :meth:`ChildDecoder.spawn`); an idle child waits for its settings on stdin. Returns their pids.
    """
    procs = [_popen(module) for _ in range(count)]
    _started.setdefault(module, []).extend(procs)
    return [p.pid for p in procs]


def prestarted(module: str) -> list[int]:
    """The pids of the children of ``module`` started ahead and not yet taken."""
    return [p.pid for p in _started.get(module, [])]


def discard_prestarted() -> None:
    """Stop the children :func:`prestart` started that no decoder took."""
    procs = [p for waiting in _started.values() for p in waiting]
    _started.clear()
    for proc in procs:
        _end(proc)


def _take(module: str) -> subprocess.Popen[bytes] | None:
    waiting = _started.get(module)
    while waiting:
        proc = waiting.pop(0)
        if proc.poll() is None:
            return proc
        _end(proc)  # it died waiting (killed by hand, say): start a new one instead
    return None


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child that nothing reads from, reap it and close its pipes (blocks briefly)."""
    _kill(proc)
    _close_pipes(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        # A frame sent after the child had gone stays in the pipe's buffer, and closing the pipe
        # flushes it into nobody: BrokenPipeError, after the pipe is closed all the same.
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


class ChildDecoder:
    """Runs ``python -m module`` and turns its frames into chunks of events.

    ``handle(frame)`` returns the events of a frame (or None) and raises for an
    error frame; whatever it raises reaches the source's ``read()``.
    """

    def __init__(
        self, name: str, module: str, handle: Handler, silence_s: float, queue_size: int = 8
    ) -> None:
        self.name = name
        self.module = module
        self.handle = handle
        self.silent_s = silence_s + SILENT_SLACK_S
        """Past this without a frame (and not held by a full queue) the child is taken for stopped."""
        self._heard = 0.0
        self._looked = 0.0
        """When :meth:`_stopped` last looked."""
        self._putting = False
        self.ahead = False
        """The child's last :data:`AHEAD`: its server had already sent more than it has written."""
        self.queue: queue.Queue[list[Event] | BaseException] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._relay: threading.Thread | None = None
        self._last_words: str | None = None
        """The child's last error message: why it exited, when it did."""

    def spawn(self) -> None:
        """Start the child process before its settings are known: it starts Python and imports
        its libraries (about 80 ms) while the source prepares, and waits for :meth:`start`.
        Call from the event loop's thread: PR_SET_PDEATHSIG fires when the *thread* that forked
        the child ends, and pool threads end when idle."""
        if self._proc is None:
            self._proc = _take(self.module) or _popen(self.module)
            # In this context: the relayed lines carry the pipeline's name (structlog contextvars).
            run = contextvars.copy_context().run
            self._relay = threading.Thread(
                target=run, args=(self._relay_stderr, self._proc.stderr), name=f"decoder-log-{self.name}",
                daemon=True,
            )  # fmt: skip
            self._relay.start()

    def start(self, cfg: Mapping[str, object]) -> None:
        """Send the child its settings (spawning it first if need be) and start the pump.
        Call from the event loop's thread (see :meth:`spawn`)."""
        self.spawn()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        write_frame(proc.stdin, cfg)
        self._heard = time.monotonic()
        self._thread = threading.Thread(target=self._pump, name=f"decoder-{self.name}", daemon=True)
        self._thread.start()

    def send(self, obj: Any) -> None:
        """One frame to the child's stdin (small and rare: written inline)."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            write_frame(proc.stdin, obj)
        except (BrokenPipeError, ValueError):
            pass  # the child has gone; the pump reports why

    def stop(self) -> None:
        """Kill the child and wait for the pump (blocking: run it in a thread)."""
        self._stop.set()
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill(proc)
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        if self._relay is not None:
            self._relay.join(5.0)
            self._relay = None
        if proc is not None:
            _close_pipes(proc)  # once the pump and the relay have read them to the end

    def next_chunk(self, max_events: int, wait: float = 0.2) -> list[Event] | BaseException:
        """Up to about ``max_events`` events, or the error the pump met ([] after ``wait`` idle)."""
        try:
            out = self.queue.get(timeout=wait)
        except queue.Empty:
            return self._stopped() or []
        if isinstance(out, BaseException):
            return out
        while len(out) < max_events:
            try:
                more = self.queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(more, BaseException):
                self.queue.put(more)  # report it on the next read, after these events
                break
            out = out + more
        return out

    def caught_up(self) -> bool:
        """Nothing decoded is waiting: the last chunk took everything the child had sent, and the
        child did not say that its server had sent more already (an :data:`AHEAD` frame)."""
        return self.queue.empty() and not self.ahead

    def _stopped(self) -> BaseException | None:
        """The child said nothing, not even :data:`ALIVE`, for :attr:`silent_s` while the pump
        was free to read it: stopped (SIGSTOP, a cgroup freezer) or hung, the stream standing
        still with ``/health`` ok. An error for the source's reader, whose restart ends it and
        starts another. Bytes waiting in the pipe mean it spoke and the pump is behind: not
        stopped. Nor after a look :data:`UNWATCHED_S` after the one before: this whole process
        was paused, and as it resumes the pump's read may have taken the pipe's bytes while it
        waits for the GIL to say so (a SIGSTOPped ``serve`` took its live child for stopped).
        Its silence is counted from that look."""
        now = time.monotonic()
        looked, self._looked = self._looked, now
        proc = self._proc
        if proc is None or proc.stdout is None or self._thread is None or self._putting:
            return None
        if now - looked > UNWATCHED_S:
            self._heard = max(self._heard, now)
            return None
        if now - self._heard <= self.silent_s or select.select([proc.stdout], [], [], 0)[0]:
            return None
        from deltaforge.sources.base import SourceError

        return SourceError(
            f"{self.name}: decoder process {proc.pid} said nothing for {self.silent_s:g} s, not even that "
            "it is alive (stopped or hung): it is ended and another started"
        )

    def _put(self, item: list[Event] | BaseException) -> None:
        self._putting = True  # a full queue holds the pump: the child's silence is then ours
        try:
            while not self._stop.is_set():
                try:
                    self.queue.put(item, timeout=0.2)
                    return
                except queue.Full:
                    continue
        finally:
            self._heard = time.monotonic()
            self._putting = False

    def _pump(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        try:
            while not self._stop.is_set():
                frame = read_frame(proc.stdout)
                self._heard = time.monotonic()
                if frame == ALIVE:
                    continue
                if frame[0] == AHEAD:
                    # Said before the frame it is about: its events are queued next. One that says
                    # "no more" with no frame after it (what followed held nothing of ours) is
                    # found by the reader's next read, which hands the held batch on (reader.py).
                    self.ahead = bool(frame[1])
                    continue
                events = self.handle(frame)
                if events:
                    self._put(events)
        except BaseException as exc:  # noqa: BLE001 - everything is handed to the actor
            if self._stop.is_set():
                return
            if isinstance(exc, EOFError):
                from deltaforge.sources.base import SourceError

                try:
                    code: int | None = proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    code = None
                relay = self._relay
                if relay is not None:
                    relay.join(5.0)  # its stderr ends with it: then what it said last is in
                said = f": {self._last_words}" if self._last_words else ""
                exc = SourceError(f"{self.name}: decoder process exited (code {code}){said}")
            self._put(exc)

    def _relay_stderr(self, err: IO[bytes]) -> None:
        """The child's stderr, line by line, as log events; remembers its last error."""
        import structlog

        log = structlog.get_logger().bind(decoder=self.name)
        try:
            for raw in err:
                line = raw.decode(errors="replace").rstrip()
                if not line:
                    continue
                try:
                    doc = json.loads(line) if line.startswith("{") else None
                except ValueError:
                    doc = None
                if not isinstance(doc, dict) or "logger" not in doc:
                    # Not from our handler: the interpreter's own last words, a C library's print
                    log.warning("decoder_output", actor="decoder", line=line)
                    self._last_words = line
                    continue
                fields = {k: v for k, v in doc.items() if k in ("message", "exception")}
                error = doc.get("level") in ("error", "critical")
                if error:
                    self._last_words = str(doc.get("message"))
                log_library_line(log, str(doc["logger"]), error, **fields)  # repeats: once a minute
        except (OSError, ValueError):
            pass  # closed by stop()
