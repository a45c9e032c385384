"""The PostgreSQL sink's statements for a change that does not carry every column.

A MySQL/MariaDB row image logged with ``binlog_row_image`` MINIMAL or NOBLOB, PostgreSQL's
unchanged TOAST values and Debezium's placeholder for them: the change says what changed, not
what the row is. It can only change a row the target has:

* the key kept: ``UPDATE`` of the columns it carries (an ``INSERT … ON CONFLICT`` would make a
  row of NULLs where the change has no value, for a key the target lacks);
* the key changed: the row is moved in place (``UPDATE`` of its key and the columns carried),
  unless a row holds the new key already: that one takes the columns carried, and the old row
  goes, as a change with every column does. A delete and an insert of what the change carried
  brought the row back with NULL in every other column.

A key the target lacks gets nothing (no row the source does not have). With ``if_newer`` each
statement applies only over an older position, as the sink's others do, so a replay changes
nothing a newer change wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaforge.sinks.pgtypes import NATIVE_FORM
from deltaforge.sinks.pgtypes import quoted as _q

if TYPE_CHECKING:
    from deltaforge.sinks.postgres import PostgresSink

Statement = tuple[str, tuple[Any, ...]]


def partial_change(
    sink: PostgresSink,
    table: str,
    keys: tuple[str, ...],
    columns: tuple[str, ...],
    row: dict[str, Any],
    old: dict[str, Any] | None,
    pos: str,
) -> list[Statement]:
    """The statements of an update carrying only ``columns`` of ``row``; ``old``: the before image
    when the key changed (None: kept)."""
    forms = sink._forms.get(table, {})
    settable = tuple(c for c in columns if not forms.get(c, NATIVE_FORM).always)  # identity: kept
    others = tuple(c for c in settable if c not in keys)
    tail = (pos,) if sink.if_newer else ()
    new_key = sink._args(table, keys, row)
    update = _update_sql(sink, table, others, keys)
    out = [] if update is None else [(update, (*sink._args(table, others, row), *new_key, *tail))]
    if old is None:
        return out
    moved = tuple(dict.fromkeys((*keys, *others)))  # the new key first: the move checks it is free
    args = (*sink._args(table, moved, row), *sink._args(table, keys, old), *tail)
    return [(_move_sql(sink, table, moved, keys), args), *out, sink._delete(table, keys, old, pos)]


def _guard(sink: PostgresSink, table: str, n: int) -> str:
    pc = _q(sink.position_column)
    return f" AND ({table}.{pc} IS NULL OR {table}.{pc} < ${n})"


def _sets(sink: PostgresSink, table: str, columns: tuple[str, ...]) -> list[str]:
    return [f"{_q(c)} = {sink._mark(table, c, i)}" for i, c in enumerate(columns, 1)]


def _where(sink: PostgresSink, table: str, keys: tuple[str, ...], first: int) -> str:
    return " AND ".join(f"{table}.{_q(k)} = {sink._mark(table, k, first + i)}" for i, k in enumerate(keys))


def _update_sql(
    sink: PostgresSink, table: str, columns: tuple[str, ...], keys: tuple[str, ...]
) -> str | None:
    """``columns`` (no key among them) on the row of the key; parameters: ``columns``, the key,
    the position."""
    key = ("pu", table, columns, keys)
    if (sql := sink._sql.get(key)) is None:
        n = len(columns)
        sets, where = _sets(sink, table, columns), _where(sink, table, keys, n + 1)
        if sink.if_newer:
            sets.append(f"{_q(sink.position_column)} = ${n + len(keys) + 1}")
            where += _guard(sink, table, n + len(keys) + 1)
        if not sets:
            return None  # the key alone, and no position kept: nothing to write
        sql = sink._sql[key] = f"UPDATE {table} SET {', '.join(sets)} WHERE {where}"
    return sql


def _move_sql(sink: PostgresSink, table: str, columns: tuple[str, ...], keys: tuple[str, ...]) -> str:
    """The row of the old key moved to the new one with ``columns`` (the new key first), when no
    row holds the new key; parameters: ``columns``, the old key, the position."""
    key = ("pm", table, columns, keys)
    if (sql := sink._sql.get(key)) is None:
        n = len(columns)
        sets = _sets(sink, table, columns)
        where = _where(sink, table, keys, n + 1)
        taken = " AND ".join(f"o.{_q(k)} = {sink._mark(table, k, i)}" for i, k in enumerate(keys, 1))
        if sink.if_newer:
            sets.append(f"{_q(sink.position_column)} = ${n + len(keys) + 1}")
            where += _guard(sink, table, n + len(keys) + 1)
        sql = sink._sql[key] = (
            f"UPDATE {table} SET {', '.join(sets)} WHERE {where} AND NOT EXISTS (SELECT 1 FROM {table} o WHERE {taken})"
        )
    return sql
