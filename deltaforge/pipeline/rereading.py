"""When the source may be read again for a lagging sink that is back.

A sink that is back rejoins at the first batch of a new reading, which starts at its checkpoint:
the other sinks skip what they hold until that reading is past it, and get nothing new meanwhile.
A sink whose probe answers while its writes fail (Redis out of memory answers ``PING``, a
PostgreSQL target whose disk is full answers ``SELECT 1``) fails that first batch, lags, is
probed and is back again: when the next reading was asked for before the last one had got
anywhere, the others never got past where they were. So after one reading asked for, the next
waits until a reading since has caught up with the source (a batch cut with nothing more
ready): between two, every other sink gets everything there was, and a sink that keeps coming
back costs them one re-reading each time, not everything after. The first comeback is not held.
"""

from __future__ import annotations


class Rereading:
    """What the batches handed to the sinks say of the readings asked for (see the module).

    >>> r = Rereading()
    >>> r.may_rewind()
    True
    >>> r.rewound(epoch=1); r.may_rewind()
    False
    >>> r.delivered(epoch=2, caught_up=False), r.may_rewind()  # the new reading, behind
    (False, False)
    >>> r.delivered(epoch=2, caught_up=True), r.may_rewind()
    (True, True)
    """

    def __init__(self) -> None:
        self._after: int | None = None  # a reading after this epoch must catch up first

    def may_rewind(self) -> bool:
        return self._after is None

    def rewound(self, epoch: int) -> None:
        """A new reading was asked for while reading ``epoch``."""
        self._after = epoch

    def delivered(self, epoch: int, caught_up: bool) -> bool:
        """A batch of reading ``epoch`` was handed to the sinks (``caught_up``: cut with nothing
        more ready in the source); True when it ends the wait for a reading."""
        if self._after is None or epoch <= self._after or not caught_up:
            return False
        self._after = None
        return True
