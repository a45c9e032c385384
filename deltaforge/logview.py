"""``deltaforge logs``: structlog JSON lines shown as readable, coloured, filtered lines."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

import orjson
from rich.console import Console
from rich.text import Text

LEVELS = ["debug", "info", "warning", "error", "critical"]
_COLORS = {"debug": "dim", "info": "cyan", "warning": "yellow", "error": "bold red", "critical": "bold red"}
_SHOWN = ("ts", "level", "log_level", "pipeline", "actor", "supervisor", "event")


def follow(stream: IO[str], keep_following: bool, path: str | None = None) -> Iterator[str]:
    """Lines of ``stream``; with ``keep_following`` wait for more at the end (``tail -F``): once
    ``path`` names another file than the one read (``serve`` rotated away, see logsetup), the
    rest of the old one is read, then the new one from its start."""
    try:
        while True:
            line = stream.readline()
            if line:
                yield line
            elif not keep_following:
                return
            elif path is not None and (newer := _rotated(stream, path)) is not None:
                stream.close()
                stream = newer
            else:
                time.sleep(0.2)
    finally:
        if path is not None:  # a file this reads, not stdin
            stream.close()


def _rotated(stream: IO[str], path: str) -> IO[str] | None:
    """The file now at ``path``, when it is not the one ``stream`` reads (None: the same, or none)."""
    try:
        at = os.stat(path)
        own = os.fstat(stream.fileno())
        if (at.st_ino, at.st_dev) == (own.st_ino, own.st_dev):
            return None
        return open(path)  # follow() closes it
    except (OSError, ValueError):  # gone for now, or stdin
        return None


def matches(
    rec: dict[str, Any],
    pipeline: str | None,
    actor: str | None,
    level: str | None,
    events: Sequence[str] = (),
) -> bool:
    if events and rec.get("event") not in events:
        return False
    if pipeline and rec.get("pipeline") != pipeline:
        return False
    if actor and actor not in str(rec.get("actor", "")) and actor != rec.get("supervisor"):
        return False
    if level:
        lvl = str(rec.get("level") or rec.get("log_level") or "info")
        if lvl in LEVELS and LEVELS.index(lvl) < LEVELS.index(level):
            return False
    return True


def render(rec: dict[str, Any]) -> Text:
    level = str(rec.get("level") or rec.get("log_level") or "info")
    text = Text()
    text.append(str(rec.get("ts", ""))[11:23] + " ", style="dim")
    text.append(f"{level.upper():<7} ", style=_COLORS.get(level, ""))
    where = "/".join(str(rec[k]) for k in ("pipeline", "actor") if rec.get(k))
    if not rec.get("actor") and rec.get("supervisor"):
        where = "/".join(x for x in (str(rec.get("pipeline") or ""), str(rec["supervisor"])) if x)
    if where:
        text.append(f"{where} ", style="magenta")
    text.append(str(rec.get("event", "")), style="bold")
    if rec.get("event") == "waiting_on":
        return _waits(text, rec)
    for k, v in rec.items():
        if k not in _SHOWN:
            text.append(f" {k}=", style="dim")
            text.append(v if isinstance(v, str) else orjson.dumps(v, default=str).decode())
    return text


def _waits(text: Text, rec: dict[str, Any]) -> Text:
    """serve's answer to SIGUSR1 (``waiting.py``), one await or frame a line under its task or
    thread, as a stack is read: on one line it was a wall of JSON."""
    blocks = [("task", t.get("task"), t.get("awaits")) for t in rec.get("tasks") or () if isinstance(t, dict)]
    blocks += [("thread", name, frames) for name, frames in dict(rec.get("threads") or {}).items()]
    for kind, name, lines in blocks:
        text.append(f"\n  {kind} ", style="dim")
        text.append(str(name), style="magenta")
        for line in lines or ():
            text.append(f"\n    {line}")
    return text


def _opened(path: str, follow_mode: bool) -> IO[str]:
    """The log file; with ``follow_mode`` one that is not there yet is waited for (``tail -F``:
    ``logs -f`` started before ``serve`` made it), else it is an error (it was a traceback)."""
    said = False
    while True:
        try:
            return open(path)  # closed by run()
        except FileNotFoundError:
            if not follow_mode:
                raise
            if not said:
                print(f"waiting for {path} to be made", file=sys.stderr, flush=True)
                said = True
            time.sleep(0.2)


def run(
    path: str | None,
    follow_mode: bool,
    pipeline: str | None,
    actor: str | None,
    level: str | None,
    color: bool | None = None,
    events: Sequence[str] = (),
) -> int:
    console = Console(force_terminal=color, no_color=color is False, highlight=False, soft_wrap=True)
    try:
        stream = _opened(path, follow_mode) if path else sys.stdin
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    try:
        for line in follow(stream, follow_mode, path):
            line = line.strip()
            if not line:
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                rec = None
            if not isinstance(rec, dict):  # not a log record (a library's own line): shown as is
                console.print(Text(line, style="dim"))
                continue
            if matches(rec, pipeline, actor, level, events):
                console.print(render(rec))
    except KeyboardInterrupt:
        return 0
    finally:
        if path:
            stream.close()
    return 0
