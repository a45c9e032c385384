"""Files named on the command line (``--api-token-file``, ``--token-file``, ``pipelines -f``,
``schema -o``): one that cannot be read or written ends the command saying which and why, exit
1, where it was a traceback (``FileNotFoundError``) for a mistyped path."""

from __future__ import annotations

import sys
from pathlib import Path


def read(path: str, flag: str) -> str:
    """The text of the file ``flag`` names (``-``: standard input)."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise _cannot(flag, path, exc) from None


def token(path: str, flag: str) -> str | None:
    """The API token a file holds: its first line (a second one, a note of when it was rotated,
    made the whole text the token, which no request could then match)."""
    lines = read(path, flag).splitlines()
    return (lines[0].strip() if lines else "") or None


def write(path: str, text: str, flag: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise _cannot(flag, path, exc) from None


def _cannot(flag: str, path: str, exc: OSError) -> SystemExit:
    return SystemExit(f"deltaforge: {flag} {path}: {exc.strerror or exc}")
