"""When the source may be read again for a lagging sink that is back.

A sink that is back rejoins at the first batch of a new reading, which starts at its checkpoint:
the other sinks skip what they hold until that reading is back where they were, and get nothing
new meanwhile. A sink whose probe answers while its writes fail (a Redis refusing writes with
``NOREPLICAS`` answers ``PING``, a PostgreSQL target whose disk is full ``SELECT 1``) fails that first batch,
lags, is probed and is back again: once a re-reading took longer than the next comeback, the
others never got past where they were. So after a reading asked for has got back to where the
others were, the next waits :data:`SHARE` times as long as that took: a sink that keeps coming
back takes at most a fifth of the time from the others, however far behind it is. The first
comeback, and one long after the last, is not held.
"""

from __future__ import annotations

from deltaforge.position import Position, earliest

SHARE = 4.0
"""The next reading for a sink back waits this many times as long as the last one took to get
back to where the other sinks were."""


def at_or_after(position: Position, mark: Position) -> bool:
    """Whether a sink at ``position`` holds everything one at ``mark`` holds."""
    return earliest([position, mark]).to_doc() == mark.to_doc()


class Rereading:
    """What the batches handed to the sinks say of the readings asked for (see the module).

    >>> from deltaforge.sources.turso.position import TursoPosition as At
    >>> r = Rereading()
    >>> r.delivered(epoch=1, at=At(7), now=0.0)  # the sinks were given up to change 7
    >>> r.rewound(epoch=1, now=10.0); r.may_rewind(now=10.0)
    False
    >>> r.delivered(epoch=2, at=At(3), now=11.0); r.may_rewind(now=11.0)  # behind 7
    False
    >>> r.delivered(epoch=2, at=At(7), now=12.0)  # back at 7 after 2 s: the next in 8 s
    >>> r.may_rewind(now=19.0), r.may_rewind(now=20.0)
    (False, True)
    """

    def __init__(self) -> None:
        self.reached: Position | None = None
        """Where the last batch handed to the sinks went (held while a reading is on its way back)."""
        self._asked: tuple[int, Position, float] | None = None  # the epoch asked in, where, when
        self._free_at = 0.0

    def may_rewind(self, now: float) -> bool:
        return self._asked is None and now >= self._free_at

    def rewound(self, epoch: int, now: float) -> None:
        """A new reading was asked for, at ``now``, while reading ``epoch``."""
        if self.reached is not None:
            self._asked = (epoch, self.reached, now)

    def delivered(self, epoch: int, at: Position, now: float) -> None:
        """A batch of reading ``epoch`` that ends ``at`` was handed to the sinks at ``now``. No
        position is compared unless a reading asked for is on its way back: a reading's batches
        only go forward."""
        asked = self._asked
        if asked is None:
            self.reached = at
        elif epoch > asked[0] and at_or_after(at, asked[1]):
            self._asked = None
            self.reached = at
            self._free_at = now + SHARE * (now - asked[2])
