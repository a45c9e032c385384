"""A decoder child for tests/test_decoder_child.py: logs a library warning, then does what its
settings say (``crash``: an exception nothing catches; ``print``: bare text, exit code 3;
``sigint``/``sighup``: the signal Ctrl-C / a closed terminal sends the whole process group,
then one more frame; ``pid``: a
frame with its process id; ``idle``: nothing more, for ever, as on a quiet server; ``repeat``:
one library error five times over, its numbers changing, then exit code 0; ``big``: a frame
of 900 kB, then exit code 0)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from deltaforge.sources.childframes import write_frame
from deltaforge.sources.childside import child_setup


def main() -> None:
    cfg, out = child_setup()
    logging.getLogger("some.library").warning("first line,\n        then an indented second")
    write_frame(out, ("said",))
    if cfg["then"] == "crash":
        raise RuntimeError("the probe crashed on purpose")
    if cfg["then"] in ("sigint", "sighup"):
        os.kill(os.getpid(), signal.SIGINT if cfg["then"] == "sigint" else signal.SIGHUP)
        write_frame(out, ("still here",))
    if cfg["then"] == "pid":
        write_frame(out, ("pid", os.getpid()))
    if cfg["then"] == "repeat":
        for port in range(9092, 9097):
            logging.getLogger("some.library").error("connect to port %d failed", port)
    if cfg["then"] == "big":
        write_frame(out, ("big", b"x" * 900_000))
    if cfg["then"] == "idle":
        threading.Event().wait()
    if cfg["then"] == "print":
        sys.stderr.write("Fatal Python error: the probe's last words\n")
        sys.stderr.flush()
        sys.exit(3)


if __name__ == "__main__":
    main()
