"""Batch cutting: transactions are never split; limits cut; time flushes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deltaforge.events import Event
from deltaforge.pipeline.batching import cut_point
from tests.kit import make_event


def stream(tx_sizes: list[int], sizes: list[int]) -> list[Event]:
    events = []
    seq = 1
    for tx, n in enumerate(tx_sizes):
        for i in range(n):
            events.append(make_event(seq, tx, i == n - 1, size=sizes[seq % len(sizes)]))
            seq += 1
    return events


def cut_all(
    events: list[Event], max_events: int, max_bytes: int, respect: bool, chunk: int
) -> list[list[Event]]:
    """Feed events in chunks like the Accumulator does; flush at the end."""
    batches: list[list[Event]] = []
    buf: list[Event] = []
    for start in range(0, len(events), chunk):
        buf.extend(events[start : start + chunk])
        while (n := cut_point(buf, max_events, max_bytes, respect)) > 0:
            batches.append(buf[:n])
            buf = buf[n:]
    while buf and (n := cut_point(buf, max_events, max_bytes, respect, final=True)) > 0:
        batches.append(buf[:n])
        buf = buf[n:]
    assert not buf
    return batches


@settings(max_examples=300, deadline=None)
@given(
    tx_sizes=st.lists(st.integers(1, 60), min_size=1, max_size=40),
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=10),
    max_events=st.integers(1, 50),
    max_bytes=st.integers(1, 20_000),
    chunk=st.integers(1, 100),
)
def test_no_transaction_is_ever_split(
    tx_sizes: list[int], sizes: list[int], max_events: int, max_bytes: int, chunk: int
) -> None:
    events = stream(tx_sizes, sizes)
    batches = cut_all(events, max_events, max_bytes, True, chunk)
    assert [e for b in batches for e in b] == events  # nothing lost, nothing reordered
    where: dict[str, set[int]] = {}
    for i, b in enumerate(batches):
        assert b[-1].tx_end
        for e in b:
            where.setdefault(e.tx_id, set()).add(i)
    assert all(len(v) == 1 for v in where.values())
    for b in batches:
        # a batch over the limits is over only because its last transaction was
        over = len(b) > max_events or sum(e.size for e in b) > max_bytes
        if over:
            firsts = [i for i, e in enumerate(b) if i == 0 or b[i - 1].tx_end]
            last_tx_start = firsts[-1]
            head = b[:last_tx_start]
            assert len(head) < max_events and sum(e.size for e in head) < max_bytes


@settings(max_examples=200, deadline=None)
@given(
    tx_sizes=st.lists(st.integers(1, 30), min_size=1, max_size=30),
    max_events=st.integers(1, 20),
    chunk=st.integers(1, 50),
)
def test_without_respect_batches_obey_max_events(tx_sizes: list[int], max_events: int, chunk: int) -> None:
    events = stream(tx_sizes, [100])
    batches = cut_all(events, max_events, 10**9, False, chunk)
    assert [e for b in batches for e in b] == events
    assert all(len(b) <= max_events for b in batches)


def test_partial_transaction_waits_and_final_flush_cuts_at_last_tx_end() -> None:
    events = stream([3, 4], [100])[:5]  # second transaction incomplete
    assert cut_point(events, 100, 10**9, True) == 0
    assert cut_point(events, 100, 10**9, True, final=True) == 3
    assert cut_point(events, 100, 10**9, False, final=True) == 5


def test_large_transaction_grows_the_batch() -> None:
    events = stream([500, 2], [10])
    assert cut_point(events, 10, 10**9, True) == 500
