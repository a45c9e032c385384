"""Imported first by the command line: structlog loads without rich.

structlog's ``dev`` and ``tracebacks`` modules import rich at import time (if it is installed)
to draw coloured tracebacks for its console renderer; deltaforge logs JSON and formats
exceptions as plain text, so that is 50 ms of every ``serve`` start spent on nothing — a tenth
of the restart-to-first-event budget. rich is hidden while structlog loads and is importable
again at once: ``deltaforge logs``, ``top`` and the snapshot progress bars use it as usual.
Decoder child processes do not import this (nor structlog).
"""

from __future__ import annotations

import sys

from deltaforge import codecache

codecache.install()  # before the first dataclass: structlog's, just below

if "structlog" not in sys.modules and "rich" not in sys.modules:
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]
