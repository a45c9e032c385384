"""Whether ``turso_cdc``'s change ids started again below the reader's position.

Turso declares ``change_id INTEGER PRIMARY KEY AUTOINCREMENT`` but keeps no sequence (probed,
pyturso 0.8.3: ``sqlite_sequence`` stays empty), so a new change takes the largest id left plus
one. Once the table is emptied (its read rows deleted while the reader is caught up: the obvious
clean-up) or its newest rows deleted, ids start again below the reader's position, and a reader
asking for ids above it skips every change since without a word. The row at the position tells:
while it is there and is the same change, ids have not gone back; gone, ids below the position
mean they did.
"""

from __future__ import annotations

from typing import Any

_AT = (
    "SELECT (SELECT min(change_id) FROM turso_cdc), "
    "(SELECT change_txn_id FROM turso_cdc WHERE change_id = ?), "
    "(SELECT change_time FROM turso_cdc WHERE change_id = ?)"
)


def ids_went_back(conn: Any, after: int, known: tuple[int, int] | None) -> str | None:
    """Why the ids in ``turso_cdc`` no longer continue after ``after`` (the last change read, whose
    transaction and time are ``known`` when recorded), or None while they do. Blocking."""
    if not after:
        return None
    first, txn, at = conn.execute(_AT, (after, after)).fetchone()
    conn.commit()  # end the read transaction, as every read of the source does
    if first is None or int(first) > after:
        return None  # emptied and nothing new yet, or pruned up to the position: ids go on
    if txn is not None and (known is None or (int(txn), int(at)) == known):
        return None
    return (
        f"turso_cdc's change ids started again below the position (change_id {after}; the table now starts "
        f"at {first}): it was emptied, or its newest rows deleted, while deltaforge read it, and Turso keeps no "
        "AUTOINCREMENT sequence, so the changes since cannot be told from those read (prune turso_cdc keeping "
        "its newest row)"
    )
