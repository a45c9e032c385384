"""Kafka record keys: the row's primary key as JSON, and whether an update moves it.

One row's changes share a key, so they stay in one partition, in order; an update that
changes the primary key is written as a delete and a create (``kafka.py``), each under its own key.
"""

from __future__ import annotations

from deltaforge.envelopes import encode
from deltaforge.events import Event


def moves_key(e: Event) -> bool:
    """An update whose primary-key columns differ between its images."""
    key, before, after = e.source.key, e.before, e.after
    return bool(key and before and after and any(k in before and before[k] != after.get(k) for k in key))


def row_key(e: Event) -> bytes | str | None:
    """The record key: the row's primary key as JSON, Debezium's shape (``{"id": 1}``), from the
    after image or, for a delete, the before image; a table without a known key falls back to
    its first column."""
    row = e.after if e.after is not None else e.before
    if not row:
        return None
    key = e.source.key
    if key:
        return encode({k: row.get(k) for k in key})
    return str(next(iter(row.values())))
