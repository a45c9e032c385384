"""Kafka records as change events: JSON envelopes parsed back, or raw records carried as they are.

A record of a ``debezium``, ``native`` or ``cloudevents`` topic becomes the row change it describes,
with the upstream source's table, transaction and event ids (so idempotency keys survive the trip
through Kafka) and, when the upstream connector is a deltaforge source, the upstream position's
order: ``if_newer`` in a PostgreSQL sink then compares upstream positions, as it would reading the
database itself. Other connectors' changes are ordered by their offset, which for one key (one
partition) is the order they were written in.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any, NamedTuple

import orjson

from deltaforge.events import Event, Row, new_event, new_source_info
from deltaforge.position import PositionDoc
from deltaforge.sources.kafka.connect_types import typed_images, unavailable_marked
from deltaforge.sources.kafka.position import KafkaPosition

_OPS = frozenset(("c", "u", "d", "r", "t"))
"""A change's ops; ``t`` is a TRUNCATE (deltaforge's and Debezium's), with no row images."""
# Keys of an envelope's source block that are not the upstream position.
_NOT_POSITION = frozenset(("connector", "db", "schema", "table", "ts_ms", "name", "snapshot", "version",
                           "sequence", "ts_us", "ts_ns"))  # fmt: skip
_POSITIONS = {
    "mysql": ("deltaforge.sources.mysql.position", "BinlogPosition"),
    "postgres": ("deltaforge.sources.postgres.position", "PgPosition"),
    "turso": ("deltaforge.sources.turso.position", "TursoPosition"),
}


class Malformed(ValueError):
    """A record that is not what the source's ``format`` says."""


class Upstream(NamedTuple):
    """Where the change was read upstream, as its envelope says (a deltaforge source's position
    document, Debezium's ``file``/``pos`` or ``lsn``, or a raw record's topic/partition/offset)."""

    doc: PositionDoc
    rank: tuple[int, ...]

    @property
    def order(self) -> tuple[int, ...]:
        return self.rank

    def to_doc(self) -> PositionDoc:
        return self.doc


class Record(NamedTuple):
    """What the consumer fetched, without the client library's types."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    @property
    def where(self) -> str:
        return f"topic {self.topic} partition {self.partition} offset {self.offset}"


@cache
def _position_type(connector: str) -> Any:
    found = _POSITIONS.get(connector)
    return getattr(importlib.import_module(found[0]), found[1]) if found else None


def upstream_order(connector: str, doc: PositionDoc, offset: int) -> tuple[int, ...]:
    """The upstream position's order for a deltaforge connector (and Debezium's MySQL one, whose
    ``file``/``pos``/``row`` are a binlog position too), the WAL position (``lsn``) for Debezium's
    PostgreSQL connector, else ``(offset,)``. Offsets order a row's changes only while they stay
    in one partition; a position orders them across partitions (a topic repartitioned moves keys)."""
    kind = _position_type(connector)
    if kind is not None:
        try:
            return kind.from_doc(doc).order  # type: ignore[no-any-return]
        except (ValueError, TypeError):
            pass
    if connector == "postgresql" and type(lsn := doc.get("lsn")) is int:
        return (lsn,)
    return (offset,)


def _text(raw: bytes | None) -> str | bytes | None:
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def _row(value: Any, name: str) -> Row | None:
    if value is None or isinstance(value, dict):
        return value
    raise Malformed(f"{name} is {type(value).__name__}, expected an object or null")


def _key_columns(key: bytes | None) -> tuple[str, ...]:
    """Debezium's key shape, ``{"id": 1}``: the key's field names are the primary-key columns."""
    if not key:
        return ()
    try:
        doc = orjson.loads(key)
    except orjson.JSONDecodeError:
        return ()
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    return tuple(doc) if isinstance(doc, dict) else ()


def _header(rec: Record, name: str) -> str | None:
    for k, v in rec.headers:
        if k == name:
            return v.decode(errors="replace")
    return None


class RecordReader:
    """Turns records into events for one source (its connector name and tenant)."""

    def __init__(self, fmt: str, tenant: str) -> None:
        self.format = fmt
        self.tenant = tenant

    def raw(self, rec: Record, checkpoint: KafkaPosition) -> Event:
        """The record as it is: ``after`` (``before`` for a tombstone) holds its key, value and headers."""
        row = {
            "topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp,
            "key": _text(rec.key), "value": _text(rec.value), "headers": {k: _text(v) for k, v in rec.headers},
        }  # fmt: skip
        where = Upstream(
            {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}, (rec.offset,)
        )
        info = new_source_info("kafka", "kafka", rec.topic, where, rec.timestamp, None, ())
        op, before, after = ("d", row, None) if rec.value is None else ("c", None, row)
        return new_event(op, before, after, info, f"kafka:{rec.topic}:{rec.partition}:{rec.offset}", True,
                         f"{rec.topic}:{rec.partition}:{rec.offset}", (rec.offset,), checkpoint, self.tenant,
                         len(rec.value or b"") + len(rec.key or b""))  # fmt: skip

    def event(self, rec: Record, checkpoint: KafkaPosition) -> Event | None:
        """The change ``rec`` describes; None for a tombstone of an envelope topic (no change of its
        own: it follows a delete so that compaction forgets the key)."""
        if self.format == "raw":
            return self.raw(rec, checkpoint)
        if rec.value is None:
            return None
        try:
            doc = orjson.loads(rec.value)
        except orjson.JSONDecodeError as exc:
            raise Malformed(f"not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise Malformed(f"a JSON {type(doc).__name__}, expected an object")
        return self._change(self._unwrap(doc), rec, checkpoint)

    def _unwrap(self, doc: dict[str, Any]) -> dict[str, Any]:
        if self.format == "cloudevents":
            data = doc.get("data")
            if doc.get("specversion") is None or not isinstance(data, dict):
                raise Malformed("not a CloudEvent with an object in data")
            return data
        if self.format == "debezium" and "payload" in doc and "schema" in doc:  # with the inline schema
            payload = doc["payload"]
            if not isinstance(payload, dict):
                raise Malformed("payload is not an object")
            return typed_images(doc["schema"], payload)  # Kafka Connect's dates, decimals, bytes
        return doc

    def _change(self, doc: dict[str, Any], rec: Record, checkpoint: KafkaPosition) -> Event:
        op = doc.get("op")
        if op not in _OPS:
            raise Malformed(f"op is {op!r}, expected one of c, u, d, r, t")
        before, after = _row(doc.get("before"), "before"), _row(doc.get("after"), "after")
        if self.format == "debezium":
            before, after = unavailable_marked(before), unavailable_marked(after)
        if op == "t":
            before = after = None
        elif (after if op != "d" else before) is None:
            raise Malformed(f"op {op!r} without its {'before' if op == 'd' else 'after'} image")
        src = doc.get("source")
        if not isinstance(src, dict) or not isinstance(src.get("table"), str):
            raise Malformed("no source object with a table name")
        connector = str(src.get("connector") or "kafka")
        pos: PositionDoc = {k: v for k, v in src.items() if k not in _NOT_POSITION}
        order = upstream_order(connector, pos, rec.offset)
        ts = src.get("ts_ms") or doc.get("ts_ms") or rec.timestamp
        schema = src.get("schema")
        info = new_source_info(connector, str(src.get("db") or ""), src["table"], Upstream(pos, order),
                               ts if isinstance(ts, int) else rec.timestamp,
                               schema if isinstance(schema, str) else None, _key_columns(rec.key))  # fmt: skip
        tx_id, event_id = self._ids(doc, rec)
        return new_event(op, before, after, info, tx_id, True, event_id, order, checkpoint, self.tenant,
                         len(rec.value or b"") + len(rec.key or b""))  # fmt: skip

    def _ids(self, doc: dict[str, Any], rec: Record) -> tuple[str, str]:
        """The upstream transaction and event ids: what the idempotency key is made of."""
        tx = doc.get("tx") if self.format != "debezium" else doc.get("transaction")
        tx_id = tx.get("id") if isinstance(tx, dict) else None
        event_id = doc.get("event_id")
        if not isinstance(event_id, str):
            key = _header(rec, "idempotency_key")
            event_id = key.rsplit("|", 1)[-1] if key else None
        here = f"{rec.topic}:{rec.partition}:{rec.offset}"
        return (str(tx_id) if tx_id is not None else f"kafka:{here}"), (event_id or here)
