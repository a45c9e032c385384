"""Wire envelopes (native, debezium, cloudevents) and their JSON encoding."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, cast

import orjson

from deltaforge.events import Event, Row, SourceInfo

ENVELOPES = ("native", "debezium", "cloudevents")


def json_default(value: Any) -> Any:
    """orjson's ``default`` for what a change's values hold beyond JSON's types: bytes as base64,
    a Decimal as its text, dates and times in ISO form, a MySQL TIME as ``[-]HH:MM:SS[.ffffff]``."""
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


def bytes_from_json(value: Any) -> Any:
    """What :func:`json_default` made of bytes, back: base64 text as the bytes it encodes (a value
    read back from JSON, a Kafka topic's); anything else, other text too, as it is."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:  # binascii.Error is one
            return value
    return value


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
    return _native(ev, _source(ev))


def _native(ev: Event, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "op": ev.op,
        "before": ev.before,
        "after": ev.after,
        "source": source,
        "tx": {"id": ev.tx_id, "end": ev.tx_end},
        "event_id": ev.event_id,
        "idempotency_key": ev.idempotency_key,
        "ts_ms": ev.source.ts_ms,
    }


def debezium(ev: Event) -> dict[str, Any]:
    """Debezium's value envelope (``payload`` only, no inline schema)."""
    return _debezium(ev, _source(ev))


def _debezium(ev: Event, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "before": ev.before,
        "after": ev.after,
        "source": {**source, "name": ev.tenant, "snapshot": snapshot_marker(ev)},
        "op": ev.op,
        "ts_ms": ev.source.ts_ms,
        "transaction": {"id": ev.tx_id, "total_order": None, "data_collection_order": None},
    }


def cloudevents(ev: Event) -> dict[str, Any]:
    """CloudEvents 1.0 structured mode with the native event as ``data``."""
    return _cloudevents(ev, _source(ev))


def _cloudevents(ev: Event, source: dict[str, Any]) -> dict[str, Any]:
    s = ev.source
    return {
        "specversion": "1.0",
        "id": ev.idempotency_key,
        "source": f"/deltaforge/{ev.tenant}/{s.connector}/{s.db}",
        "type": f"io.deltaforge.change.{ev.op}",
        "subject": f"{s.db}.{s.table}",
        "time": datetime.fromtimestamp(s.ts_ms / 1000).astimezone().isoformat(),
        "datacontenttype": "application/json",
        "data": _native(ev, source),
    }


_SHAPES: dict[str, Callable[[Event], dict[str, Any]]] = {
    "native": native,
    "debezium": debezium,
    "cloudevents": cloudevents,
}


def shape(name: str) -> Callable[[Event], dict[str, Any]]:
    """The envelope function called ``name``."""
    return _SHAPES[_known(name)]


def _known(name: str) -> str:
    if name not in _SHAPES:
        raise ValueError(f"unknown envelope {name!r}; expected one of {', '.join(ENVELOPES)}")
    return name


def encode(doc: dict[str, Any]) -> bytes:
    """JSON bytes of one envelope (orjson; bytes become base64)."""
    return orjson.dumps(doc, default=json_default)


_SHAPES_OF: dict[str, Callable[[Event, dict[str, Any]], dict[str, Any]]] = {
    "native": _native,
    "debezium": _debezium,
    "cloudevents": _cloudevents,
}
"""The shapes given their ``source`` part already made (:func:`encoder`, :func:`encode_lines`)."""


def row_key(e: Event) -> bytes | str | None:
    """A change's record key: the row's primary key as JSON, Debezium's shape (``{"id": 1}``),
    from the after image or, for a delete, the before image; a table without a known key falls
    back to its first column. Here, not with the Kafka sink, because the decoder children make it
    too (``Event.made``) and import nothing of the sinks."""
    row = e.after if e.after is not None else e.before
    if not row:
        return None
    key = e.source.key
    if len(key) == 1:  # the usual key: one column, without a comprehension's frame
        k = key[0]
        return encode({k: row.get(k)})
    if key:
        return encode({k: row.get(k) for k in key})
    return str(next(iter(row.values())))


def encoder(name: str, lines: bool = False) -> Callable[[Event], bytes]:
    """``lambda ev: encode(shape(name)(ev))`` (with a newline after each with ``lines``), for one
    sink: each has its own, used by one thread at a time (the batch it is delivering).

    Events that share their ``SourceInfo`` object, one after another, share the ``source`` part
    of their envelope, made once, and from the second on are encoded from a template
    (:func:`_template`): a snapshot chunk's rows of one table do (docs/performance.md has what
    each saves). The part is only ever serialised, never changed; the ``SourceInfo`` it
    was made from is kept with it, so an identity check cannot match a newer object at a reused
    address. A closure, not a class: an instance's ``__call__`` cost more per change event (each
    has an origin of its own) than sharing saves.
    """
    fn, dumps, default = _SHAPES_OF[_known(name)], orjson.dumps, json_default
    option = orjson.OPT_APPEND_NEWLINE if lines else None
    info: SourceInfo | None = None
    source: dict[str, Any] = {}
    fill: Callable[[Event], bytes | None] | None = None
    second = False

    def encode_one(ev: Event) -> bytes:
        nonlocal info, source, fill, second
        if ev.source is not info:
            source, info, fill, second = _source(ev), ev.source, None, False
        elif not second:  # the origin's second event: a run of rows, where a template pays
            fill, second = _template(fn, ev, source, option), True
        if fill is not None and (done := fill(ev)) is not None:
            return done
        return dumps(fn(ev, source), default=default, option=option)

    if name != "native":
        return encode_one
    # An event decoded in another process may come with its native envelope made there
    # (Event.made): sent as it is, serve's GIL pays nothing for it (docs/performance.md).
    if lines:

        def native_line(ev: Event) -> bytes:
            made = ev.made
            return encode_one(ev) if made is None else made[0] + b"\n"

        return native_line

    def native_one(ev: Event) -> bytes:
        made = ev.made
        return encode_one(ev) if made is None else made[0]

    return native_one


_AFTER = "\x00deltaforge.after\x00"
_EVENT_ID = "\x00deltaforge.event_id\x00"
"""Stand-ins for the fields a run of rows of one origin differ in; no name or value of a source
holds a NUL."""

_AFTER_JSON = orjson.dumps(_AFTER)
_STAND_INS = re.compile(
    b"(" + re.escape(_AFTER_JSON) + b"|" + re.escape(orjson.dumps(_EVENT_ID)[1:-1]) + b")"
)


def _template(
    fn: Callable[[Event, dict[str, Any]], dict[str, Any]],
    ev: Event,
    source: dict[str, Any],
    option: int | None,
) -> Callable[[Event], bytes | None] | None:
    """A snapshot chunk's rows share their origin and differ in ``after`` and ``event_id`` (and
    what ``event_id`` makes, the idempotency key), until the chunk's last row. So the envelope
    of ``ev`` is encoded once with stand-ins for the two, and each row's is those bytes with its
    own two encoded in: building and encoding each row's whole document cost several times as
    much (docs/performance.md). JSON encodes a string character by character, so a string holding
    the event id (the idempotency key) encodes to the text around it and the event id's.

    The function returned gives an event's envelope, or None for one that differs from ``ev`` in
    more than those two (a chunk's last row ends its transaction). Generated code, as
    :func:`deltaforge.slots.slot_constructor`. None when the stand-ins do not come out as
    expected (a name holding one), or ``ev`` has a ``before``: no template."""
    if ev.before is not None:
        return None
    probe = replace(ev, after=cast(Row, _AFTER), event_id=_EVENT_ID)  # a str where a row goes
    raw = orjson.dumps(fn(probe, source), default=json_default, option=option)
    pieces = _STAND_INS.split(raw)
    if pieces[1::2].count(_AFTER_JSON) != 1:
        return None
    ns: dict[str, Any] = {"_dumps": orjson.dumps, "json_default": json_default, "_op": ev.op, "_tx": ev.tx_id,
                          "_tenant": ev.tenant, "_end": ev.tx_end, "_last": ev.event_id.endswith(":last")}  # fmt: skip
    parts = []
    for j, piece in enumerate(pieces):
        if j % 2:
            parts.append("a" if piece == _AFTER_JSON else "i")
        else:
            ns[f"_p{j}"] = piece
            parts.append(f"_p{j}")
    code = (
        "def fill(e):\n"
        "    if (e.tx_end is _end and e.before is None and e.op == _op and e.tx_id == _tx\n"
        "            and e.tenant == _tenant and e.event_id.endswith(':last') is _last):\n"
        "        a = _dumps(e.after, default=json_default)\n"
        + ("        i = _dumps(e.event_id)[1:-1]\n" if "i" in parts else "")
        + f"        return b''.join(({', '.join(parts)},))\n"
        "    return None\n"
    )
    exec(code, ns)
    fill: Callable[[Event], bytes | None] = ns["fill"]
    # a check, once per run: what the template makes of ``ev`` is what encoding it makes
    return fill if fill(ev) == orjson.dumps(fn(ev, source), default=json_default, option=option) else None


def encode_lines(events: list[Event], envelope: str) -> bytes:
    """One JSON document per line: the body of a JSONL write."""
    encode_one = encoder(envelope, lines=True)
    return b"".join([encode_one(e) for e in events])
