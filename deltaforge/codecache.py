"""Compiled dataclass methods, kept between runs: a quarter of ``serve``'s import time back.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and
(frozen) ``__setattr__``/``__delattr__`` as source text and compiles it with ``exec``, at every
start. About 120 classes are made while ``serve`` imports (deltaforge's messages and settings,
pydantic, anyio, structlog): 6 compiles each, some 75 ms of CPU, on the way to the first event
after a restart (``docs/performance.md`` has the figures).

:func:`install` puts a caching ``exec`` in the ``dataclasses`` module's namespace (the name its
code looks up before the builtin): each text is compiled once, as ``exec`` would compile it
(``<string>``, no ``__future__`` flags inherited), and the code objects are kept in a file under
the user's cache directory, keyed by Python's bytecode magic number. What is run is unchanged:
the same text gives the same code. A missing, unreadable or stale file only means compiling, as
before; the file is written at exit when something new was compiled, unless bytecode writing is
off (``PYTHONDONTWRITEBYTECODE``), as for ``.pyc`` files. It is trusted as those are: whoever
can write the user's cache directory can already change what the user's Python runs.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from types import CodeType
from typing import Any

_MAGIC = importlib.util.MAGIC_NUMBER


def cache_file() -> Path:
    """Where the compiled methods are kept (``$XDG_CACHE_HOME/deltaforge``, else ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deltaforge" / f"dataclass-code.{sys.implementation.cache_tag}.marshal"


class CodeCache:
    """Source text -> code object, loaded from and saved to :func:`cache_file`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.codes: dict[str, CodeType] = {}
        self.added = 0
        self.hits = 0

    def load(self) -> None:
        try:
            data = self.path.read_bytes()
            if data[: len(_MAGIC)] == _MAGIC:
                codes = marshal.loads(data[len(_MAGIC) :])
                if isinstance(codes, dict):
                    self.codes = codes
        except (OSError, ValueError, EOFError, TypeError):
            pass  # none yet, or damaged: compile as before

    def compiled(self, source: str) -> CodeType:
        code = self.codes.get(source)
        if code is None:
            # As exec(source) in dataclasses compiles it: that module has no __future__ imports.
            code = compile(source, "<string>", "exec", dont_inherit=True)
            self.codes[source] = code
            self.added += 1
        else:
            self.hits += 1
        return code

    def exec(self, source: Any, globals: Any = None, locals: Any = None, /) -> None:
        """``exec``, with ``source`` text compiled once."""
        builtins.exec(self.compiled(source) if isinstance(source, str) else source, globals, locals)

    def save(self) -> None:
        """Write the file if anything was compiled (atomically: other processes may read it)."""
        if not self.added or sys.dont_write_bytecode:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError, ValueError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(_MAGIC + marshal.dumps(self.codes))
            os.replace(tmp, self.path)
            self.added = 0
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


_installed: CodeCache | None = None


def install(path: Path | None = None) -> CodeCache:
    """Cache what ``dataclasses`` compiles from now on in this process (idempotent)."""
    global _installed
    if _installed is not None:
        return _installed
    cache = CodeCache(path or cache_file())
    cache.load()
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]
    atexit.register(cache.save)
    _installed = cache
    return cache
