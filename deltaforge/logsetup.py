"""structlog set-up: one JSON object per line with ``pipeline``, ``actor`` and ``event``.

Logs are a user interface: ``python -m deltaforge logs`` reads these lines back
and shows them filtered and coloured.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson
import structlog

from deltaforge.logrepeats import log_library_line
from deltaforge.redact import redact


class _Tee:
    """Writes each rendered line to several streams (stderr and a log file).

    A stream that cannot be written (its disk is full, stderr's reader has gone) loses the line,
    and the log call goes on: raised from a log call, the error crashed whichever actor was
    logging, and the supervisor's own restart log then failed the same way, so a full disk
    stopped the pipeline. Once the stream takes lines again, the first says how many it lost.
    """

    def __init__(self, streams: list[IO[str]]) -> None:
        self.streams = streams
        self.lost = [0] * len(streams)
        self.why = [""] * len(streams)

    def msg(self, message: str) -> None:
        for i, s in enumerate(self.streams):
            try:
                if self.lost[i]:
                    s.write(_lost_line(self.lost[i], self.why[i]))
                    self.lost[i] = 0
                s.write(message + "\n")
                s.flush()
            except (OSError, ValueError) as exc:  # ValueError: a stream already closed
                self.lost[i] += 1
                self.why[i] = f"{type(exc).__name__}: {exc}"

    log = debug = info = warn = warning = error = critical = exception = msg


def _lost_line(count: int, why: str) -> str:
    doc = {"event": "log_lines_lost", "actor": "logsetup", "level": "warning", "count": count, "reason": why,
           "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z")}  # fmt: skip
    return orjson.dumps(doc).decode() + "\n"


class _LogFile:
    """The log file, written unbuffered: a write that fails leaves nothing pending in a buffer to
    come out later glued to another line. A line cut short by a full disk is ended before the next.
    A file rotated away (renamed, as logrotate does, or removed) is followed by a new one at the
    path, looked at again at most every ``check_every_s``: ``deltaforge logs`` reads the path."""

    check_every_s = 1.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.torn = False
        self.checked = time.monotonic()

    def _follow(self) -> None:
        """Open the file at the path again when it is not the one open (best effort: a path that
        cannot be opened now leaves the lines going where they went)."""
        try:
            at = os.stat(self.path)
            own = os.fstat(self.fd)
            if (at.st_ino, at.st_dev) == (own.st_ino, own.st_dev):
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            return
        os.close(self.fd)
        self.fd, self.torn = fd, False

    def write(self, text: str) -> int:
        if (now := time.monotonic()) - self.checked >= self.check_every_s:
            self.checked = now
            self._follow()
        data = memoryview((("\n" if self.torn else "") + text).encode())
        while data:
            data = data[os.write(self.fd, data) :]  # OSError: raised with ``torn`` as it stands
            self.torn = True  # part of it is in the file: a failure now leaves it to be ended
        self.torn = False
        return len(text)

    def flush(self) -> None:
        pass


class _Stderr:
    """``sys.stderr`` as it is at each write: the snapshot progress bar swaps it for a proxy that
    prints log lines above the bar."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _TeeFactory:
    def __init__(self, streams: list[IO[str]]) -> None:
        self.tee = _Tee(streams)

    def __call__(self, *args: Any) -> _Tee:
        return self.tee


def _serialize(obj: Any, **kw: Any) -> str:
    # The whole line, tracebacks included: a driver may put a DSN in an error message.
    return redact(orjson.dumps(obj, default=str).decode())


class _Libraries(logging.Handler):
    """What libraries log with the standard ``logging`` module (aiokafka, asyncpg, uvicorn,
    librdkafka through confluent-kafka's ``logger`` setting) or warn of (``py.warnings``), as
    deltaforge's JSON lines with the library's logger as ``actor``: otherwise Python prints them
    as bare text on stderr, among the JSON lines, where ``deltaforge logs`` cannot filter them.
    A line said again and again is logged once a minute, with ``repeated``: how many were held
    back (``logrepeats``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a library's bad format string must not lose the line
            message = str(record.msg)
        if record.name == "py.warnings":  # "file:line: Category: text", then the source line: noise
            message = message.partition("\n")[0]
        extra: dict[str, Any] = {"exc_info": record.exc_info} if record.exc_info else {}
        # at ERROR and up an error, else a warning: the handler takes those and up
        log_library_line(
            structlog.get_logger(), record.name, record.levelno >= logging.ERROR, message=message, **extra
        )


def configure(level: str = "info", log_file: str | Path | None = None, stderr: bool = True) -> None:
    """JSON lines to stderr and/or ``log_file``, at ``level`` and above."""
    streams: list[IO[str]] = []
    if stderr:
        streams.append(_Stderr())  # type: ignore[arg-type]
    if log_file is not None:
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        streams.append(_LogFile(path))  # type: ignore[arg-type]  # lives as long as the process
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_serialize),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=_TeeFactory(streams),
        cache_logger_on_first_use=False,
    )
    # A library's warnings.warn (aiomysql passes on the server's warnings so) as a JSON line too
    logging.captureWarnings(True)
    root = logging.getLogger()
    if not any(isinstance(h, _Libraries) for h in root.handlers):
        root.addHandler(_Libraries(logging.WARNING))
