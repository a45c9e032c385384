"""The C allocator's settings for a process that frees a whole batch at once.

glibc hands the free memory at the top of its heap back to the kernel as soon as more than
``M_TRIM_THRESHOLD`` (128 KiB by default) is free there. A pipeline frees a batch's worth at
once: the encoded documents of a batch (orjson builds each in a fresh buffer of a page and
shrinks it in place, so every document kept until the batch is sent holds about a page of
heap), the rows of a snapshot chunk, a decoder child's frames. So every batch gave its pages
back and the next faulted them in again, one page fault per page, all in the thread doing the
batch's Python work. Keeping freed memory at the top of the heap lets each batch reuse the last
one's pages. The memory kept is what the largest batch needed, which the bounded mailboxes and
``max_events``/``max_bytes`` already bound; docs/performance.md has the measurements.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2

KEEP = 128 << 20
"""Free memory at the top of the heap kept rather than trimmed (glibc's ``M_TRIM_THRESHOLD``)."""
PAD = 16 << 20
"""Extra the heap grows by each time it must grow (``M_TOP_PAD``): fewer, larger steps."""


def keep_freed_heap(keep: int = KEEP, pad: int = PAD) -> bool:
    """Ask glibc to keep up to ``keep`` bytes of freed heap for reuse; ``False`` where the C
    library has no ``mallopt`` or refuses it (not glibc), which leaves its defaults alone."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, keep)) and bool(mallopt(M_TOP_PAD, pad))
