"""How both ``python -m deltaforge`` and the ``deltaforge`` console script start: the decoder
children ``serve`` will want first, then the rest of the imports with the cyclic collector off.

Start-up imports make few reference cycles, and every collection during them rescans all that
was loaded so far: about 30 ms of CPU on the way to the first event after a restart
(docs/performance.md). What they loaded is then frozen out of the collector's sight, as
serve's own settings do (gctune.py), so no later collection scans it either.

This module imports nothing of deltaforge's at its top: the console script's wrapper imports it
before anything else, and whatever it imported would load before the children start.
"""

from __future__ import annotations

import gc
import sys


def main() -> int:
    """Run the command line in ``sys.argv`` (the entry point of both ways in)."""
    gc.disable()
    from deltaforge import earlystart

    earlystart.decoders(sys.argv[1:])  # serve's decoder children start while the rest is imported
    from deltaforge.cli import main as cli

    gc.freeze()
    gc.enable()
    return cli()
