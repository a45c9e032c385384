"""Events to Arrow tables and back: the only way batches travel to Spark.

A batch becomes one Arrow table per source table, because row images of
different tables have different columns. Each table has the columns

    _seq (int64)  op (string)  db (string)  table (string)  before (struct)  after (struct)

where ``before`` and ``after`` are structs typed from the table's declared schema
(so ``after.amount > 100`` compares numbers) and ``_seq`` is the event's index in
the batch, which restores source order after the job. When the declared schema
does not fit the values (a column added since start, SQLite's dynamic typing),
the struct type is inferred from the values instead; nothing is ever dropped to
make a value fit.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from deltaforge.events import Event, with_images
from supervision import Fatal

SEQ = "_seq"
EVENT_COLUMNS = (SEQ, "op", "db", "table", "before", "after")
REPLACEABLE = ("op", "before", "after")


class TransformError(Fatal):
    """A batch cannot go through the processors as it is; a retry would fail the same way."""


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A source table's columns as Arrow types, in table order."""

    db: str
    table: str
    columns: tuple[tuple[str, pa.DataType], ...]
    json: frozenset[str] = frozenset()
    """Columns declared JSON: they travel as JSON text (Spark's JSON functions apply)."""

    @property
    def struct(self) -> pa.StructType:
        return pa.struct([pa.field(name, typ) for name, typ in self.columns])

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.columns)


def batch_schema(image: pa.DataType) -> pa.Schema:
    """The Arrow schema of one table's events whose row images have type ``image``."""
    return pa.schema(
        [
            pa.field(SEQ, pa.int64(), nullable=False),
            pa.field("op", pa.string()),
            pa.field("db", pa.string()),
            pa.field("table", pa.string()),
            pa.field("before", image),
            pa.field("after", image),
        ]
    )


def empty_table(schema: TableSchema) -> pa.Table:
    """No rows, the right types: what processors are analysed against at start."""
    return batch_schema(schema.struct).empty_table()


def group_by_table(events: list[Event]) -> tuple[dict[tuple[str, str], list[int]], list[int]]:
    """Indices of the events of each table, in order, and of the heartbeats (op ``h``: no table).

    Tables are keyed ``(schema or db, table)``: PostgreSQL names a table by its
    schema, MySQL and Turso by their database. A batch's events come in runs of
    one table: an event of the run's table is appended without a key made and
    looked up (10k events: 2.4 -> 0.7 ms).
    """
    groups: dict[tuple[str, str], list[int]] = {}
    heartbeats: list[int] = []
    db = table = None
    run: list[int] = []
    for i, e in enumerate(events):
        source = e.source
        if source.table == table and (source.schema or source.db) == db and e.op != "h":
            run.append(i)
        elif e.op == "h":
            heartbeats.append(i)
        else:
            db, table = source.schema or source.db, source.table
            run = groups.setdefault((db, table), [])
            run.append(i)
    return groups, heartbeats


@dataclass(frozen=True, slots=True)
class ArrowBatch:
    """One table's events as sent to Spark, and how to read the result back."""

    table: pa.Table
    seqs: frozenset[int]
    json: frozenset[str]
    """Columns sent as JSON text (declared JSON, or values no Arrow type holds)."""

    @property
    def image(self) -> pa.DataType:
        return self.table.schema.field("after").type


def to_arrow(events: list[Event], indices: list[int], schema: TableSchema | None) -> ArrowBatch:
    """One table's events as an Arrow table, row images typed by ``schema`` where values fit."""
    picked = [events[i] for i in indices]
    rows = [e.before for e in picked] + [e.after for e in picked]
    n = len(picked)
    images, json = _fast_images(rows, schema)
    if images is None:
        images, json = _column_images(rows, schema)
    src = picked[0].source
    table = pa.Table.from_arrays(
        [
            pa.array(indices, pa.int64()),
            pa.array([e.op for e in picked], pa.string()),
            pa.repeat(pa.scalar(src.db, pa.string()), n),  # one value: no list of n to convert
            pa.repeat(pa.scalar(src.table, pa.string()), n),
            images.slice(0, n),
            images.slice(n),
        ],
        schema=batch_schema(images.type),
    )
    return ArrowBatch(table, frozenset(indices), json)


def _fast_images(
    rows: list[dict[str, Any] | None], schema: TableSchema | None
) -> tuple[pa.Array | None, frozenset[str]]:
    """The whole struct in one conversion, when every row has only declared columns."""
    if schema is None or schema.json:
        return None, frozenset()
    # every row's columns in one set, built in C: half the time of a subset test per row
    if not set().union(*[r.keys() for r in rows if r is not None]) <= schema.names:
        return None, frozenset()
    try:
        return pa.array(rows, type=schema.struct), frozenset()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None, frozenset()


def _column_images(
    rows: list[dict[str, Any] | None], schema: TableSchema | None
) -> tuple[pa.Array, frozenset[str]]:
    """Column by column: the declared type, else the values' own type, else JSON text.

    Nothing is dropped to make a value fit: a column added since start is
    typed from its values, and values no single Arrow type can hold (PostgreSQL
    json, an unchanged-TOAST marker in a text column) travel as JSON text and
    are decoded again on the way back.
    """
    declared = dict(schema.columns) if schema is not None else {}
    names = list(declared)
    seen = set(names)
    for r in rows:
        if r is not None:
            for k in r:
                if k not in seen:
                    seen.add(k)
                    names.append(k)
    json_cols = set(schema.json) if schema is not None else set()
    children: list[pa.Array] = []
    for name in names:
        values = [None if r is None else r.get(name) for r in rows]
        if any(isinstance(v, set | frozenset) for v in values):
            # MySQL SET values: Arrow would take a set's arbitrary iteration order
            values = [sorted(v, key=str) if isinstance(v, set | frozenset) else v for v in values]
        array = None if name in json_cols else _typed(values, declared.get(name))
        if array is None:
            json_cols.add(name)
            array = pa.array(
                [None if v is None else orjson.dumps(v, default=_json_default).decode() for v in values],
                pa.string(),
            )
        children.append(array)
    mask = pa.array([r is None for r in rows], pa.bool_())
    fields = [pa.field(name, child.type) for name, child in zip(names, children, strict=True)]
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask), frozenset(json_cols)


def _typed(values: list[Any], declared: pa.DataType | None) -> pa.Array | None:
    for typ in (declared, None) if declared is not None else (None,):
        try:
            array = pa.array(values, type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            continue
        if pa.types.is_null(array.type):
            return pa.array(values, pa.string())  # all nulls: Spark wants a real type
        return array
    return None


def result_seqs(result: pa.Table, sent: ArrowBatch, path: str) -> list[int]:
    """The ``_seq`` of each row of a job's result, every one of them refused unless it was sent."""
    if SEQ not in result.column_names:
        raise TransformError(f"{path}: the result has no {SEQ} column")
    seqs: list[int] = result.column(SEQ).to_pylist()
    if not sent.seqs.issuperset(seqs):
        bad = next(q for q in seqs if q not in sent.seqs)
        raise TransformError(f"{path}: returned a row whose {SEQ} ({bad}) was not in the batch")
    return seqs


def from_arrow(result: pa.Table, events: list[Event], sent: ArrowBatch, path: str) -> list[tuple[int, Event]]:
    """Events of a job's result, each with its ``_seq``.

    ``op``, ``before`` and ``after`` in the result replace the event's; every other
    field (position, transaction, idempotency key) stays the source's. Timestamps
    that Spark hands back in UTC become naive again where they went in naive, and
    JSON-text columns are decoded again.
    """
    seqs = result_seqs(result, sent, path)
    replaced: dict[str, list[Any]] = {}
    for name in REPLACEABLE:
        if name in result.column_names:
            column = result.column(name).combine_chunks()
            if name == "op":
                replaced[name] = column.to_pylist()
                continue
            images = restore_types(column, sent.image).to_pylist()
            if sent.json:
                for image in images:
                    if image is not None:
                        _decode_json(image, sent.json)
            replaced[name] = images
    picked = [events[q] for q in seqs]
    ops = replaced.get("op") or [e.op for e in picked]
    befores = replaced.get("before") or [e.before for e in picked]
    afters = replaced.get("after") or [e.after for e in picked]
    return [
        (
            seq,
            e
            if (op == e.op and after == e.after and before == e.before)
            else with_images(e, op, before, after),
        )
        for seq, e, op, before, after in zip(seqs, picked, ops, befores, afters, strict=True)
    ]


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _decode_json(image: dict[str, Any], columns: frozenset[str]) -> None:
    for name in columns:
        value = image.get(name)
        if isinstance(value, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                image[name] = orjson.loads(value)


def restore_types(column: pa.Array, sent: pa.DataType) -> pa.Array:
    """Cast struct fields back to the type they were sent with where only the time zone differs."""
    if not pa.types.is_struct(column.type) or not pa.types.is_struct(sent):
        return column
    sent_fields = {f.name: f.type for f in sent}
    fields: list[pa.Field] = []
    children: list[pa.Array] = []
    changed = False
    for f, child in zip(column.type, column.flatten(), strict=True):
        want = sent_fields.get(f.name)
        if (
            want is not None
            and pa.types.is_timestamp(f.type)
            and pa.types.is_timestamp(want)
            and want.tz is None
            and f.type.tz is not None
        ):
            child = child.cast(pa.timestamp(f.type.unit))
            changed = True
        fields.append(pa.field(f.name, child.type))
        children.append(child)
    if not changed:
        return column
    return pa.StructArray.from_arrays(children, fields=fields, mask=column.is_null())


def merge_in_order(parts: Iterable[list[tuple[int, Event]]]) -> list[tuple[int, Event]]:
    """Results of every table of a batch, back in source order with their ``_seq``, refusing duplicates."""
    merged = sorted(itertools.chain.from_iterable(parts), key=operator.itemgetter(0))
    seqs = [q for q, _ in merged]
    if any(map(operator.eq, seqs, itertools.islice(seqs, 1, None))):
        twice = next(a for a, b in itertools.pairwise(seqs) if a == b)
        raise TransformError(
            f"event {SEQ}={twice} came back twice; processors may drop or change events, never add them"
        )
    return merged
