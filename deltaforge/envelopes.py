"""Wire envelopes (native, debezium, cloudevents) and their JSON encoding."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import orjson

from deltaforge.events import Event

ENVELOPES = ("native", "debezium", "cloudevents")


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        # Debezium's default binary handling: base64 text.
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, date | datetime | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        # MySQL TIME: a signed duration, shown as [-]HH:MM:SS[.ffffff] (it may exceed 24h)
        total = value.days * 86400 + value.seconds
        sign, total = ("-", -total - (1 if value.microseconds else 0)) if total < 0 else ("", total)
        micros = (1_000_000 - value.microseconds) % 1_000_000 if sign else value.microseconds
        h, rem = divmod(total, 3600)
        text = f"{sign}{h:02d}:{rem // 60:02d}:{rem % 60:02d}"
        return f"{text}.{micros:06d}" if micros else text
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def snapshot_marker(ev: Event) -> str:
    """Debezium's ``source.snapshot``: ``true`` (initial), ``incremental`` (asked for while
    streaming), ``last`` (the last row of a snapshot) or ``false`` (a change)."""
    if ev.op != "r":
        return "false"
    if ev.event_id.endswith(":last"):
        return "last"
    return "incremental" if ev.tx_id.startswith("snapshot:incremental:") else "true"


def _source(ev: Event) -> dict[str, Any]:
    s = ev.source
    return {
        "connector": s.connector,
        "db": s.db,
        "schema": s.schema,
        "table": s.table,
        "ts_ms": s.ts_ms,
        **s.position.to_doc(),
    }


def native(ev: Event) -> dict[str, Any]:
    """deltaforge's own shape: everything an event carries."""
    return {
        "op": ev.op,
        "before": ev.before,
        "after": ev.after,
        "source": _source(ev),
        "tx": {"id": ev.tx_id, "end": ev.tx_end},
        "event_id": ev.event_id,
        "idempotency_key": ev.idempotency_key,
        "ts_ms": ev.source.ts_ms,
    }


def debezium(ev: Event) -> dict[str, Any]:
    """Debezium's value envelope (``payload`` only, no inline schema)."""
    return {
        "before": ev.before,
        "after": ev.after,
        "source": {**_source(ev), "name": ev.tenant, "snapshot": snapshot_marker(ev)},
        "op": ev.op,
        "ts_ms": ev.source.ts_ms,
        "transaction": {"id": ev.tx_id, "total_order": None, "data_collection_order": None},
    }


def cloudevents(ev: Event) -> dict[str, Any]:
    """CloudEvents 1.0 structured mode with the native event as ``data``."""
    s = ev.source
    return {
        "specversion": "1.0",
        "id": ev.idempotency_key,
        "source": f"/deltaforge/{ev.tenant}/{s.connector}/{s.db}",
        "type": f"io.deltaforge.change.{ev.op}",
        "subject": f"{s.db}.{s.table}",
        "time": datetime.fromtimestamp(s.ts_ms / 1000).astimezone().isoformat(),
        "datacontenttype": "application/json",
        "data": native(ev),
    }


_SHAPES: dict[str, Callable[[Event], dict[str, Any]]] = {
    "native": native,
    "debezium": debezium,
    "cloudevents": cloudevents,
}


def shape(name: str) -> Callable[[Event], dict[str, Any]]:
    """The envelope function called ``name``."""
    try:
        return _SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown envelope {name!r}; expected one of {', '.join(ENVELOPES)}") from None


def encode(doc: dict[str, Any]) -> bytes:
    """JSON bytes of one envelope (orjson; bytes become base64)."""
    return orjson.dumps(doc, default=_default)


def encode_lines(events: list[Event], envelope: str) -> bytes:
    """One JSON document per line: the body of a JSONL write."""
    fn = shape(envelope)
    return b"".join(orjson.dumps(fn(e), default=_default, option=orjson.OPT_APPEND_NEWLINE) for e in events)
