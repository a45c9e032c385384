"""``deltaforge logs``: structlog JSON lines shown as readable, coloured, filtered lines."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import orjson
from rich.console import Console
from rich.text import Text

LEVELS = ["debug", "info", "warning", "error", "critical"]
_COLORS = {"debug": "dim", "info": "cyan", "warning": "yellow", "error": "bold red", "critical": "bold red"}
_SHOWN = ("ts", "level", "log_level", "pipeline", "actor", "supervisor", "event")


def follow(stream: IO[str], keep_following: bool) -> Iterator[str]:
    """Lines of ``stream``; with ``keep_following`` wait for more at the end (tail -f)."""
    while True:
        line = stream.readline()
        if line:
            yield line
        elif keep_following:
            time.sleep(0.2)
        else:
            return


def matches(rec: dict[str, Any], pipeline: str | None, actor: str | None, level: str | None) -> bool:
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
    for k, v in rec.items():
        if k not in _SHOWN:
            text.append(f" {k}=", style="dim")
            text.append(v if isinstance(v, str) else orjson.dumps(v, default=str).decode())
    return text


def run(
    path: str | None,
    follow_mode: bool,
    pipeline: str | None,
    actor: str | None,
    level: str | None,
    color: bool | None = None,
) -> int:
    console = Console(force_terminal=color, no_color=color is False, highlight=False, soft_wrap=True)
    stream: IO[str] = open(path) if path else sys.stdin  # noqa: SIM115 - closed at exit
    try:
        for line in follow(stream, follow_mode):
            line = line.strip()
            if not line:
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                console.print(Text(line, style="dim"))
                continue
            if isinstance(rec, dict) and matches(rec, pipeline, actor, level):
                console.print(render(rec))
    except KeyboardInterrupt:
        return 0
    finally:
        if path:
            stream.close()
    return 0
