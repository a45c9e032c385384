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
    events: list[Event],
    max_events: int,
    max_bytes: int,
    respect: bool,
    chunk: int,
    max_tx_events: int | None = None,
    held: list[int] | None = None,
) -> list[list[Event]]:
    """Feed events in chunks like the Accumulator does; flush at the end. ``held`` gets the
    buffer's length after each chunk is taken in and cut."""
    batches: list[list[Event]] = []
    buf: list[Event] = []
    split = ""  # as the Accumulator keeps it: the last transaction cut before its end

    def take(final: bool) -> bool:
        nonlocal buf, split
        n = cut_point(buf, max_events, max_bytes, respect, final, max_tx_events, split)
        if n:
            batches.append(buf[:n])
            buf = buf[n:]
            split = split if batches[-1][-1].tx_end else batches[-1][-1].tx_id
        return n > 0

    for start in range(0, len(events), chunk):
        buf.extend(events[start : start + chunk])
        while take(final=False):
            pass
        if held is not None:
            held.append(len(buf))
    while buf and take(final=True):
        pass
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


@settings(max_examples=300, deadline=None)
@given(
    tx_sizes=st.lists(st.integers(1, 300), min_size=1, max_size=20),
    max_events=st.integers(1, 50),
    max_tx_events=st.integers(1, 120),
    chunk=st.integers(1, 100),
)
def test_a_transaction_past_max_tx_events_is_split_and_no_other_is(
    tx_sizes: list[int], max_events: int, max_tx_events: int, chunk: int
) -> None:
    """What ``respect_source_tx`` holds back is bounded: a transaction with ``max_tx_events``
    events waiting is cut at the limits (a million-row UPDATE held whole took gigabytes); one
    smaller is never split, and nothing is lost or reordered."""
    events = stream(tx_sizes, [100])
    held: list[int] = []
    batches = cut_all(events, max_events, 10**9, True, chunk, max_tx_events, held)
    assert [e for b in batches for e in b] == events
    size = {
        e.tx_id: n
        for e, n in zip([events[sum(tx_sizes[:i])] for i in range(len(tx_sizes))], tx_sizes, strict=True)
    }
    for b in batches:
        if not b[-1].tx_end:  # a split: only of a transaction that large, and at the limits
            assert size[b[-1].tx_id] >= max_tx_events and len(b) <= max_events
    for tx, n in size.items():
        if n < max_tx_events:
            assert len({i for i, b in enumerate(batches) for e in b if e.tx_id == tx}) == 1
    assert max(held) < max_events + max_tx_events + chunk  # complete ones under the limits, then the open one


def test_once_a_transaction_is_split_its_rest_is_not_held_back_again() -> None:
    """After the first cut inside a transaction, the rest of it goes on at the limits: held back
    again up to ``max_tx_events`` each time, the buffer stayed that large for its whole length."""
    held: list[int] = []
    batches = cut_all(stream([1000], [100]), 10, 10**9, True, 7, max_tx_events=100, held=held)
    assert sum(len(b) for b in batches) == 1000 and all(len(b) <= 10 for b in batches)
    peak = held.index(max(held))  # just before the transaction reached max_tx_events waiting
    assert max(held) < 100 and max(held[peak + 1 :]) < 10 + 7
