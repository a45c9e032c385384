"""Table maps parsed once per distinct body, not once per transaction (the decoder child's).

The binlog writes a table map before every rows event of a transaction, and
python-mysql-replication parses each in full: column types, the optional metadata
(names, charsets, keys), a ``Table`` with its columns: with one-row transactions, most of
the decoder's time (docs/performance.md). A table map's parse depends only on its bytes
(the metadata deltaforge requires, ``binlog_row_metadata=FULL``, carries the names), so
a body seen before reuses the first parse. A table map that named no columns was
completed from the server's catalogue, which may change: it is parsed every time.
"""

from __future__ import annotations

from typing import Any

from pymysqlreplication.constants.BINLOG import TABLE_MAP_EVENT
from pymysqlreplication.event import BinLogEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent

from deltaforge.sources.mysql.charsets import encoding
from deltaforge.sources.mysql.rowvalues import KEY_ORDER, NAMED

LIMIT = 4096
"""Distinct table maps kept (each ALTER, and each server restart, makes new ones)."""

# What BinLogEvent.__init__ sets for each event (its checksum's verdict among them): never reused.
_OWN = frozenset(
    {"packet", "table_map", "event_type", "timestamp", "event_size", "_post_header_lengths", "_ctl_connection",
     "mysql_version", "_ignore_decode_errors", "_verify_checksum", "_is_event_valid", "_processed", "complete"}
)  # fmt: skip


def _member_bytes(self: TableMapEvent, length: int) -> list[list[bytes]] | None:
    """The library's ``_read_type_values`` (the ENUM and SET members of the optional metadata),
    keeping each member's bytes: it decoded them as UTF-8 and made a member it could not decode
    ``""``, so in a latin1 or cp1251 column ``'café'`` and ``'ж'`` came out as ``''``. They
    are in the column's character set, which comes later in the metadata: see :func:`_members`."""
    packet = self.packet
    until = packet.read_bytes + length
    if packet.read_bytes >= until:
        return None
    lists: list[list[bytes]] = []
    while packet.read_bytes < until:
        count = packet.read_length_coded_binary()
        lists.append([packet.read_variable_length_string() for _ in range(count)])
    return lists


def _text(member: Any, charset: str) -> Any:
    if not isinstance(member, bytes):
        return member  # the empty ENUM value the library puts first
    try:
        return member.decode(encoding(charset))
    except LookupError:  # a character set Python has no codec for: bytes, as its strings are
        return member


def _members(event: TableMapEvent) -> None:
    """ENUM and SET members as text, in their column's character set (see :func:`_member_bytes`)."""
    for c in event.columns:
        charset = getattr(c, "character_set_name", None) or "utf8"
        if c.enum_values:
            c.enum_values = [_text(m, charset) for m in c.enum_values]
        if c.set_values:
            c.set_values = [_text(m, charset) for m in c.set_values]


def _key_order(event: TableMapEvent) -> tuple[str, ...]:
    meta, columns = event.optional_metadata, event.columns
    # With a prefix on any key column (a BLOB's first bytes) the table map lists the key only there.
    at = list(meta.simple_primary_key_list) or list(meta.primary_keys_with_prefix)
    return tuple(columns[i].name for i in at if i < len(columns))


class KnownTableMap(TableMapEvent):  # type: ignore[misc]  # the library has no type hints
    """A ``TableMapEvent`` whose body was parsed before takes that parse; the header, the
    checksum check and the library's ``table_map`` entry are still this event's own.

    Installed for the decoder child's process by :func:`install` (the library picks an event's
    class from a table of its own); readers must list this class in ``only_events``.
    """

    parsed: dict[bytes, dict[str, Any]] = {}
    _read_type_values = _member_bytes

    def __init__(
        self, from_packet: Any, event_size: int, table_map: dict[int, Any], ctl: Any, **kw: Any
    ) -> None:
        raw = from_packet.packet  # the wrapper has read the 19-byte header: the body is next
        body = raw._data[raw._position : raw._position + event_size]  # without the checksum
        known = self.parsed.get(body)
        if known is None:
            super().__init__(from_packet, event_size, table_map, ctl, **kw)
            if self._processed:
                _members(self)
                setattr(self.table_obj, KEY_ORDER, _key_order(self))
                setattr(self.table_obj, NAMED, bool(self.optional_metadata.column_name_list))
            if self._processed and self.optional_metadata.column_name_list:
                if len(self.parsed) >= LIMIT:
                    self.parsed.clear()
                self.parsed[body] = {k: v for k, v in vars(self).items() if k not in _OWN}
            return
        BinLogEvent.__init__(self, from_packet, event_size, table_map, ctl, **kw)
        self.__dict__.update(known)
        table_map[self.table_id] = self.table_obj


def install() -> type[TableMapEvent]:
    """Make the library build table maps as :class:`KnownTableMap` in this process; the class to
    list in ``only_events``."""
    events: dict[int, type] = BinLogPacketWrapper._BinLogPacketWrapper__event_map
    events[TABLE_MAP_EVENT] = KnownTableMap
    return KnownTableMap
