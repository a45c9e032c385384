"""In a decoder process (``python -m deltaforge.sources.<kind>.decoder``): its setup, its log
lines for the parent to relay, and the beat that says it is alive. The parent's side, which
starts it and reads its frames, is ``childproc.py``; the child imports this module first and
should start fast: nothing heavy at import."""

from __future__ import annotations

import importlib
import json
import logging
import signal
import sys
import threading
import time
from typing import IO, Any

from deltaforge.sources.childframes import ALIVE, read_frame, write_frame

ALIVE_S = 1.0
"""How often a decoder process says it is alive (``childproc.ChildDecoder`` takes one silent
far longer for stopped)."""


class _JsonLines(logging.Handler):
    """In the child: each log record as one JSON line on stderr, for the parent to relay."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a library's bad format string must not lose the line
            message = str(record.msg)
        # python-mysql-replication writes its warnings over several indented lines
        doc = {"level": record.levelname.lower(), "logger": record.name, "message": " ".join(message.split())}
        if record.exc_info:
            doc["exception"] = logging.Formatter().formatException(record.exc_info)
        try:
            sys.stderr.write(json.dumps(doc) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # the parent has gone


def log_crash(exc: BaseException) -> None:
    """In the child: an error nothing expected, with its traceback, to the parent's log (the
    error frame that follows carries only its message)."""
    logging.getLogger("deltaforge.decoder").error("%s: %s", type(exc).__name__, exc, exc_info=exc)


def child_setup(warm: tuple[str, ...] = ()) -> tuple[Any, IO[bytes]]:
    """In the child: die with the parent, log as JSON lines to stderr, tune the GC, import the
    ``warm`` modules (while the parent may still be preparing the settings), read the settings;
    returns (cfg, out).

    ``cfg`` is what the parent passed to :class:`ChildDecoder` (each decoder types it).
    Later frames from the parent are read from ``sys.stdin.buffer`` with :func:`read_frame`."""
    from deltaforge import gctune

    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # Ctrl-C in a terminal signals the whole process group, and so does the terminal closing
    # (SIGHUP): the parent decides when a decoder ends (it drains first, then kills it), not a
    # KeyboardInterrupt in the middle of a frame, nor SIGHUP's default end before the drain.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.getLogger().addHandler(_JsonLines(logging.WARNING))
    sys.excepthook = lambda kind, exc, tb: log_crash(exc)
    gctune.tune()
    for module in warm:
        importlib.import_module(module)
    cfg, out = read_frame(sys.stdin.buffer), sys.stdout.buffer
    threading.Thread(target=_say_alive, args=(out,), name="alive", daemon=True).start()
    return cfg, out


def _say_alive(out: IO[bytes]) -> None:
    """In the child: ``ALIVE`` every :data:`ALIVE_S` until the parent has gone (beside the
    stream's own frames: ``write_frame``'s lock keeps each whole)."""
    while True:
        time.sleep(ALIVE_S)
        try:
            write_frame(out, ALIVE)
        except (OSError, ValueError):
            return
