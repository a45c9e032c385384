"""The frames between a decoder child and ``serve``: each a pickle, with its length and CRC-32
ahead of it (see ``childproc.py``)."""

from __future__ import annotations

import pickle
import struct
import threading
import zlib
from typing import IO, Any

FRAME = struct.Struct("<II")
"""A frame's head: the length of its pickle and the pickle's CRC-32."""


ALIVE = ("alive",)
"""The frame a decoder process writes every ``childside.ALIVE_S`` from a thread of its own, whatever
its stream does: a process stopped (SIGSTOP, a cgroup freezer) or hung says nothing, while one
that waits on a quiet server still says this."""


AHEAD = "ahead"
"""``(AHEAD, more)``: a decoder child says whether its server had already sent more when it wrote
the frame that follows (``ChildDecoder.caught_up``). Written only when it changes."""


class Ahead:
    """In a decoder child: what it last said with :data:`AHEAD`, said again only when it changes."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.more = False

    def say(self, more: bool) -> None:
        if more != self.more:
            self.more = more
            write_frame(self.out, (AHEAD, more))


class FrameDamaged(Exception):
    """A frame's bytes changed between the two processes: it is refused, never unpickled.

    Seen once, with every process stopped by a profiler (py-spy's blocking mode) hundreds of
    times a second: a string inside a frame held another frame's head. Unpickled, a change
    that left valid values would have been delivered as data.
    """


_WRITING = threading.Lock()
"""One frame written at a time: a child writes from two threads (its stream's and
``childside._say_alive``), and a buffered writer does not keep a large write whole against another
thread's (seen: frames of 175 kB refused as damaged while the alive frames were written beside them,
two runs in three; none in three runs since this lock)."""


def write_frame(out: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    with _WRITING:
        out.write(FRAME.pack(len(data), zlib.crc32(data)) + data)
        out.flush()


def read_frame(inp: IO[bytes]) -> Any:
    head = inp.read(FRAME.size)
    if len(head) < FRAME.size:
        raise EOFError("decoder closed its output")
    n, crc = FRAME.unpack(head)
    data = inp.read(n)
    if len(data) < n:
        raise EOFError("decoder output truncated")
    if zlib.crc32(data) != crc:
        raise FrameDamaged(f"a frame of {n} bytes between the decoder and deltaforge was damaged in transit")
    return pickle.loads(data)
