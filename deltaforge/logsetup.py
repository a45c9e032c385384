"""structlog set-up: one JSON object per line with ``pipeline``, ``actor`` and ``event``.

Logs are a user interface: ``python -m deltaforge logs`` reads these lines back
and shows them filtered and coloured.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import IO, Any

import orjson
import structlog

from deltaforge.redact import redact


class _Tee:
    """Writes each rendered line to several streams (stderr and a log file)."""

    def __init__(self, streams: list[IO[str]]) -> None:
        self.streams = streams

    def msg(self, message: str) -> None:
        for s in self.streams:
            s.write(message + "\n")
            s.flush()

    log = debug = info = warn = warning = error = critical = exception = msg


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
    librdkafka through confluent-kafka's ``logger`` setting), as deltaforge's JSON lines with the
    library's logger as ``actor``: otherwise Python prints them as bare text on stderr, among the
    JSON lines, where ``deltaforge logs`` cannot filter them."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a library's bad format string must not lose the line
            message = str(record.msg)
        log = structlog.get_logger().bind(actor=record.name)
        extra: dict[str, Any] = {"exc_info": record.exc_info} if record.exc_info else {}
        if record.levelno >= logging.ERROR:
            log.error("library_error", message=message, **extra)
        else:  # the handler takes warnings and up
            log.warning("library_warning", message=message, **extra)


def configure(level: str = "info", log_file: str | Path | None = None, stderr: bool = True) -> None:
    """JSON lines to stderr and/or ``log_file``, at ``level`` and above."""
    streams: list[IO[str]] = []
    if stderr:
        streams.append(_Stderr())  # type: ignore[arg-type]
    if log_file is not None:
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        streams.append(open(path, "a", buffering=1))  # noqa: SIM115 - lives as long as the process
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
    root = logging.getLogger()
    if not any(isinstance(h, _Libraries) for h in root.handlers):
        root.addHandler(_Libraries(logging.WARNING))
