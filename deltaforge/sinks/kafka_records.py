"""What a Kafka record is made of: its key and whether an update moves it, and its size as
librdkafka counts it against ``message.max.bytes``.

Message key: the ``key`` template when set, else the row's primary key as JSON
(Debezium's key shape, ``{"id": 1}``; the delete's before image for a delete),
so one row's changes, its delete included, stay in one partition, in order.
With ``tombstones: true`` a delete is followed by a null-valued record with
the same key, so log compaction forgets the row.

An update that changes the primary key becomes two records, as Debezium makes
it: a delete of the old key (in the old key's partition, header
``__debezium.newkey``) and a create of the new one (header
``__debezium.oldkey``). One record under the new key would put the old row's
end in another partition than its beginning, and a reader of several
partitions (a Kafka source feeding an ``if_newer`` upsert) could apply the
delete before the insert it deletes, and keep the row.
"""

from __future__ import annotations

from collections.abc import Callable

from deltaforge.envelopes import row_key
from deltaforge.events import Event, new_event, with_images
from deltaforge.sinks.base import PoisonEvent

Key = bytes | str | None
Header = tuple[str, str | bytes | None]
Record = tuple[str, bytes, Key, list[Header], bool]
"""Topic, value, key, headers, and whether a tombstone follows."""

MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""

# librdkafka's largest per-record overhead in a v2 record batch (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD):
# varints for length 5, attributes 1, timestamp delta 10, offset delta 5, key length 5, value
# length 5 and header count 5.
_V2_MAX_OVERHEAD = 36


def wire_size(record: Record) -> int:
    """The size librdkafka's ``produce()`` checks against ``message.max.bytes``
    (``rd_kafka_msg_max_wire_size``): the overhead, key, value, and each header's name and value
    with their zigzag varint lengths."""
    _, value, key, headers, _ = record
    size = _V2_MAX_OVERHEAD + len(value) + _len(key)
    for name, hvalue in headers:
        n, v = len(name.encode()), _len(hvalue)
        size += n + v + _varint_len(2 * n) + _varint_len(2 * v)
    return size


def check_sizes(records: list[Record], limit: int, sink: str) -> None:
    """A record over ``message.max.bytes`` (``limit``) is poison before any record of its batch is
    sent. librdkafka refuses it only in ``produce()``, when the records before it are queued and
    some already sent: purging the rest made librdkafka bump the idempotent producer's epoch
    (which Tansu fences), and the retry around the poison record sent the sent ones again.
    Only values near the limit are measured (a key and headers 64 KB long are left to
    ``produce()``)."""
    near = limit - 65_536
    for rec in records:
        if len(rec[1]) > near and (size := wire_size(rec)) > limit:
            raise PoisonEvent(
                f"kafka sink {sink!r}: MSG_SIZE_TOO_LARGE: a record of {size} bytes, over "
                f"message.max.bytes {limit} (topic {rec[0]!r})",
                "too_large",
            )


def _len(b: bytes | str | None) -> int:
    return 0 if b is None else len(b.encode() if isinstance(b, str) else b)


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def moves_key(e: Event) -> bool:
    """An update whose primary-key columns differ between its images."""
    key, before, after = e.source.key, e.before, e.after
    return bool(key and before and after and any(k in before and before[k] != after.get(k) for k in key))


class RecordMaker:
    """What a batch's events become as records: one each, two for an update that moves its primary
    key (see above). A batch at a time, in one loop that builds each record inline, as
    :meth:`_record` builds a key move's two: calls per event to build its record cost more than
    its key does (docs/performance.md). A change that comes with its record made by the decoder
    child (``Event.made``) takes the key and idempotency key made there, unless the sink's own
    ``key`` template names the key."""

    def __init__(
        self,
        topic_of: Callable[[Event], str],
        value_of: Callable[[Event], bytes],
        key_of: Callable[[Event], str] | None,
        tombstones: bool,
    ) -> None:
        self.topic_of = topic_of
        self.value_of = value_of
        self.key_of = key_of
        self.tombstones = tombstones

    def __call__(self, events: list[Event]) -> list[Record]:
        topic_of, value_of, key_of, tombstones = self.topic_of, self.value_of, self.key_of, self.tombstones
        records: list[Record] = []
        add = records.append
        for e in events:
            op = e.op
            if op == "u" and key_of is None and moves_key(e):
                records += self._moved(e)
                continue
            made = e.made  # the key and idempotency key made with the event, if they were
            add((
                topic_of(e),
                value_of(e),
                key_of(e) if key_of is not None else row_key(e) if made is None else made[1],
                [("idempotency_key", e.idempotency_key.encode() if made is None else made[2]),
                 ("event_id", e.event_id.encode())],
                op == "d" and tombstones,
            ))  # fmt: skip
        return records

    def _moved(self, e: Event) -> list[Record]:
        """A delete of the old key, then a create of the new one, each naming the other's key."""
        gone = new_event("d", e.before, None, e.source, e.tx_id, e.tx_end, f"{e.event_id}:old", e.order,
                         e.checkpoint, e.tenant, e.size)  # fmt: skip
        came = with_images(e, "c", None, e.after)
        old, new = row_key(gone), row_key(came)
        return [
            self._record(gone, ("__debezium.newkey", new)),
            self._record(came, ("__debezium.oldkey", old)),
        ]

    def _record(self, e: Event, moved: Header) -> Record:
        """Topic, value, key, headers, and whether a tombstone follows."""
        key = row_key(e) if self.key_of is None else self.key_of(e)
        headers: list[Header] = [
            ("idempotency_key", e.idempotency_key.encode()),
            ("event_id", e.event_id.encode()),
            moved,
        ]
        return self.topic_of(e), self.value_of(e), key, headers, e.op == "d" and self.tombstones
