import gc

# Start-up imports make few reference cycles, and every collection during them rescans all that
# was loaded so far: about 30 ms of CPU on the way to the first event after a restart
# (docs/performance.md). What they loaded is then frozen out of the collector's sight, as
# serve's own settings do (gctune.py), so no later collection scans it either.
gc.disable()
import sys  # noqa: E402

from deltaforge import earlystart  # noqa: E402

earlystart.decoders(sys.argv[1:])  # serve's decoder children start while the rest is imported
from deltaforge.cli import main  # noqa: E402

gc.freeze()
gc.enable()

raise SystemExit(main())
