"""Kafka Connect's logical types, read from a Debezium record's inline schema.

Debezium (with Kafka Connect's ``JsonConverter`` and ``schemas.enable``, its default) writes a
date as the days since 1970, a timestamp as the milli-, micro- or nanoseconds since then, a
time of day as those since midnight, a decimal as the base64 of its unscaled two's complement
bytes, and any bytes as base64: JSON numbers and strings, which a target column of the type
they stand for refuses or takes as something else (a ``date`` column given ``19782``). The record's
schema names each column's type, so the row images are read back as the values they carry:
``date``, naive ``datetime`` (Debezium's timestamps without a zone are wall-clock times),
``timedelta`` for a time (MySQL's TIME passes 24 hours, and may be negative), ``Decimal`` and
``bytes``, as the database sources give them. A record without a schema is left as it is: its
numbers say nothing of what they stand for.

Debezium's PostgreSQL connector writes an unchanged TOASTed value it could not read as the
placeholder ``__debezium_unavailable_value`` (bytes: its bytes; an array: a list of it):
:func:`unavailable_marked` makes it deltaforge's own marker, which a PostgreSQL sink leaves out of
its update (written as a value, the placeholder replaced the column's text).

    >>> field = {"field": "d", "type": "int32", "name": "io.debezium.time.Date"}
    >>> schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [field]}]}
    >>> typed_images(schema, {"after": {"d": 19782}})["after"]
    {'d': datetime.date(2024, 2, 29)}
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from deltaforge.envelopes import bytes_from_json

_EPOCH = dt.datetime(1970, 1, 1)
_DAY = dt.date(1970, 1, 1)


def _date(days: Any) -> Any:
    return _DAY + dt.timedelta(days=days) if isinstance(days, int) else days


def _instant(per_second: int) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if not isinstance(value, int):
            return value
        return _EPOCH + dt.timedelta(microseconds=value * 1_000_000 // per_second)

    return read


def _duration(per_second: int) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if not isinstance(value, int):
            return value
        return dt.timedelta(microseconds=value * 1_000_000 // per_second)

    return read


def _unscaled(raw: bytes, scale: int) -> Decimal:
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


def _decimal(parameters: Any) -> Callable[[Any], Any]:
    scale = int((parameters or {}).get("scale", 0))

    def read(value: Any) -> Any:
        raw = bytes_from_json(value)
        return _unscaled(raw, scale) if isinstance(raw, bytes) else value

    return read


def _variable_decimal(value: Any) -> Any:
    """Debezium's ``VariableScaleDecimal``: ``{"scale": s, "value": <base64>}``."""
    if isinstance(value, dict) and isinstance(value.get("scale"), int):
        raw = bytes_from_json(value.get("value"))
        if isinstance(raw, bytes):
            return _unscaled(raw, value["scale"])
    return value


_BY_NAME: dict[str, Callable[[Any], Any]] = {
    "io.debezium.time.Date": _date,
    "org.apache.kafka.connect.data.Date": _date,
    "io.debezium.time.Timestamp": _instant(1000),
    "org.apache.kafka.connect.data.Timestamp": _instant(1000),
    "io.debezium.time.MicroTimestamp": _instant(1_000_000),
    "io.debezium.time.NanoTimestamp": _instant(1_000_000_000),
    "io.debezium.time.Time": _duration(1000),
    "org.apache.kafka.connect.data.Time": _duration(1000),
    "io.debezium.time.MicroTime": _duration(1_000_000),
    "io.debezium.time.NanoTime": _duration(1_000_000_000),
    "io.debezium.time.MicroDuration": _duration(1_000_000),
    "io.debezium.data.VariableScaleDecimal": _variable_decimal,
}


def _reader(field: dict[str, Any]) -> Callable[[Any], Any] | None:
    if field.get("type") == "array" and isinstance(items := field.get("items"), dict):
        each = _reader(items)  # a PostgreSQL date[], numeric[], bytea[]: each element typed
        if each is None:
            return None
        return lambda v: [None if x is None else each(x) for x in v] if isinstance(v, list) else v
    name = field.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        return _decimal(field.get("parameters"))
    if isinstance(name, str) and name in _BY_NAME:
        return _BY_NAME[name]
    if field.get("type") == "bytes" and name is None:
        return bytes_from_json
    return None


UNAVAILABLE = "__debezium_unavailable_value"
"""Debezium's default ``unavailable.value.placeholder``."""
_UNAVAILABLE = frozenset((UNAVAILABLE, UNAVAILABLE.encode(), base64.b64encode(UNAVAILABLE.encode()).decode()))
_UNCHANGED = {"__unchanged_toast__": True}


def _unavailable(value: Any) -> bool:
    if isinstance(value, list):
        return len(value) == 1 and _unavailable(value[0])
    return isinstance(value, str | bytes) and value in _UNAVAILABLE


def unavailable_marked(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """``row`` with Debezium's placeholder for a value it could not read as deltaforge's
    unchanged-TOAST marker (``{"__unchanged_toast__": true}``)."""
    if not row or not any(_unavailable(v) for v in row.values()):
        return row
    return {k: (dict(_UNCHANGED) if _unavailable(v) else v) for k, v in row.items()}


def typed_images(schema: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with its ``before`` and ``after`` read as their schema's logical types say."""
    if not isinstance(schema, dict):
        return payload
    out = payload
    for image in schema.get("fields") or ():
        name = image.get("field") if isinstance(image, dict) else None
        if name not in ("before", "after") or not isinstance(row := payload.get(name), dict):
            continue
        readers = {
            f["field"]: r for f in image.get("fields") or () if isinstance(f, dict) and (r := _reader(f))
        }
        if readers:
            if out is payload:
                out = dict(payload)
            out[name] = {k: (readers[k](v) if k in readers and v is not None else v) for k, v in row.items()}
    return out
