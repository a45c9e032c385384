"""Where to cut batches: pure logic, shared by the Accumulator and its tests."""

from __future__ import annotations

from collections.abc import Sequence

from deltaforge.events import Event


def cut_point(
    events: Sequence[Event],
    max_events: int,
    max_bytes: int,
    respect_source_tx: bool,
    final: bool = False,
    max_tx_events: int | None = None,
    split: str = "",
) -> int:
    """How many leading events form the next batch; 0 means "not yet".

    A batch is cut once it reaches ``max_events`` or ``max_bytes``. With
    ``respect_source_tx`` the cut moves forward to the end of the transaction in
    progress, so a transaction is never split: a large one makes the batch
    larger — up to ``max_tx_events``: a transaction that has that many events
    waiting here is cut at the limits like any stream (after the complete
    transactions before it), or a million-row UPDATE would be held whole; so is
    the rest of the transaction ``split`` (the id of one already cut).
    ``final`` (a time- or drain-triggered flush) cuts at the last transaction
    end seen, or everything when transactions are not respected.
    """
    n = len(events)
    if n == 0:
        return 0
    size = 0
    limit = n
    for i, ev in enumerate(events):
        size += ev.size
        if i + 1 >= max_events or size >= max_bytes:
            limit = i + 1
            break
    else:
        if not final:
            return 0
    if not respect_source_tx:
        return limit
    if limit < n or not final:
        for j in range(limit - 1, n):
            if events[j].tx_end:
                return j + 1
    # No transaction ends from the limit on: the one in progress is all after the last end.
    done = _last_tx_end(events)
    if done < n and (
        (split and events[done].tx_id == split) or (max_tx_events is not None and n - done >= max_tx_events)
    ):
        return done or limit  # the complete transactions first, then the large one in pieces
    return 0 if not final else done


def _last_tx_end(events: Sequence[Event]) -> int:
    """How many leading events end at the last transaction end (0: none)."""
    for j in range(len(events) - 1, -1, -1):
        if events[j].tx_end:
            return j + 1
    return 0
