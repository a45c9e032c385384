"""PostgreSQL upsert sink (asyncpg): one transaction per batch, deletes applied.

Each change becomes ``INSERT … ON CONFLICT (key) DO UPDATE`` (or ``DELETE``) on
a target table named by a template (default ``${source.table}``), in source
order, all in one transaction per batch. With ``upsert_strategy: if_newer``
(DataFlow Operator's ifNewer, nanosync's LSN guard) every row also stores the
source position in ``position_column`` and a write applies only when it is
newer than what the row holds, so a replay after a crash can never overwrite a
newer row: each source change has exactly one effect on the final state.

Target tables must exist with the source's columns plus, for ``if_newer``, a
``text`` position column.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

import asyncpg
from pydantic import BeforeValidator, Field

from deltaforge.configmodel import Hint, PositiveNumber, PostgresDsn, SinkConfig, SinkSettings, Text, fail
from deltaforge.connectfail import host_of, why
from deltaforge.events import Event, not_carried
from deltaforge.position import Position, position_text
from deltaforge.sinks.base import NonRetryableSinkError, PoisonEvent, RetryableSinkError, Sink
from deltaforge.sinks.pgpartial import partial_change
from deltaforge.sinks.pgtypes import NATIVE_FORM, ColumnForm, column_forms, primary_key
from deltaforge.sinks.pgtypes import quoted as _q
from deltaforge.sinks.templates import Template, compile_template

_PERMANENT = (
    asyncpg.GeneratedAlwaysError,  # a column the target computes, given a value
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedColumnError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InsufficientPrivilegeError,
    asyncpg.InvalidColumnReferenceError,
    asyncpg.FeatureNotSupportedError,  # e.g. a truncate a foreign key of the target's own refuses
)
_REFUSED = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)
"""A row the target refuses (a value out of range, a constraint): the event's fault, not the sink's."""


_SESSION = (
    "SELECT current_setting('synchronous_commit'), pg_backend_pid(), "
    "(SELECT backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid())"
)
_END_ABANDONED = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2"
)

_DOT_OR_PLACEHOLDER = re.compile(r"\$\{[^}]*\}|\.")


def target_renderer(template: str) -> Callable[[Event], str]:
    """The target table per event, quoted, schema-qualified when the template names a schema: the
    template is split at its last dot outside a placeholder (``replica.${source.table}``: schema
    ``replica``), so a dot in a name a placeholder renders (a table ``order.items``) stays in the
    name. Splitting the rendered name at its last dot wrote such a table as ``items`` of a schema
    ``order``, a relation that does not exist."""
    dots = [m.start() for m in _DOT_OR_PLACEHOLDER.finditer(template) if m.group() == "."]
    if not dots:
        name_of = compile_template(template)
        return lambda e: _q(name_of(e))
    schema_of, name_of = compile_template(template[: dots[-1]]), compile_template(template[dots[-1] + 1 :])
    return lambda e: f"{_q(schema_of(e))}.{_q(name_of(e))}"


def _key_columns(value: object) -> list[str]:
    if not (isinstance(value, list) and value and all(isinstance(k, str) and k for k in value)):
        fail("expected a non-empty list of the target's primary-key columns")
    return list(value)


KeyColumns = Annotated[
    list[str], BeforeValidator(_key_columns), Hint("a non-empty list of the target's primary-key columns")
]


class PostgresSinkConfig(SinkSettings):
    """PostgreSQL tables kept equal to the source: upsert by key, delete by key."""

    dsn: PostgresDsn = Field(description="postgresql://user:password@host:port/db (${VAR} for the password).")
    table: Template = Field("${source.table}", description="Target table per event.")
    key_columns: KeyColumns | None = Field(
        None, description="The target's primary-key columns (default: the source table's primary key)."
    )
    upsert_strategy: Literal["always", "if_newer"] = Field(
        "always", description="if_newer: apply a change only when it is newer than the row's position."
    )
    position_column: Text = Field("_df_position", description="Where if_newer keeps each row's position.")
    query_timeout_s: PositiveNumber = Field(
        60.0,
        description="How long a statement may go unanswered before its connection is given up and the "
        "batch tried again on a new one: a target whose host vanished (a failover that moved its name) "
        "or a connection a NAT forgot answers nothing and closes nothing. A statement waiting this long "
        "for a lock is cancelled and tried again too.",
    )


class PostgresSink(Sink[PostgresSinkConfig]):
    """Applies changes to PostgreSQL tables by primary key."""

    def __init__(self, config: SinkConfig[PostgresSinkConfig]) -> None:
        super().__init__(config)
        cfg = self.settings
        self.dsn = cfg.dsn
        self.table_of = target_renderer(cfg.table)
        self.keys: tuple[str, ...] | None = tuple(cfg.key_columns) if cfg.key_columns else None
        self.if_newer = cfg.upsert_strategy == "if_newer"
        self.position_column = cfg.position_column
        self.query_timeout = cfg.query_timeout_s
        self._conn: asyncpg.Connection | None = None
        self._backend: tuple[int, str] | None = None  # the session's server process: pid and start
        self._abandoned: tuple[int, str] | None = None  # a session given up, to be ended at the next open
        self._sql: dict[tuple[Any, ...], str] = {}
        # Each target table's columns and how they take values (pgtypes), read once per table;
        # forgotten whenever a batch fails, so an ALTER of the target is read again.
        self._forms: dict[str, dict[str, ColumnForm]] = {}
        self._target_keys: dict[str, tuple[str, ...]] = {}  # read with the forms, without key_columns

    async def open(self) -> None:
        try:
            # command_timeout bounds every statement: nothing else notices a connection whose
            # other end vanished without a reset (no TCP keepalive on asyncpg's sockets).
            self._conn = await asyncpg.connect(self.dsn, timeout=10, command_timeout=self.query_timeout)
        except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as exc:
            raise NonRetryableSinkError(f"postgres sink {self.id!r}: {why(exc)}") from None
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            raise RetryableSinkError(
                f"postgres sink {self.id!r}: cannot connect: {why(exc, host_of(self.dsn))}"
            ) from None
        try:
            # A batch is checkpointed once its COMMIT returns. With synchronous_commit=off (the
            # server's, the database's or the role's default) that is before the commit is on
            # disk, and a crash of the target then loses batches the checkpoint has passed.
            commit, pid, since = await self._conn.fetchrow(_SESSION)
            if commit == "off":
                await self._conn.execute("SET synchronous_commit = local")
            if self._abandoned is not None:
                # The session given up for not answering may still hold its transaction's row
                # locks (a NAT forgot its connection: the server has not noticed), and this
                # batch's upserts would wait on them for ever: end it, if it is still there.
                abandoned, self._abandoned = self._abandoned, None
                with contextlib.suppress(
                    asyncpg.InsufficientPrivilegeError
                ):  # then the server's own timeouts
                    await self._conn.execute(_END_ABANDONED, *abandoned)
            self._backend = (pid, since)
        except TimeoutError:
            raise self._unanswered() from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            raise RetryableSinkError(f"postgres sink {self.id!r}: cannot connect: {why(exc)}") from None

    def _unanswered(self) -> RetryableSinkError:
        """The connection given up without a word to the server: a goodbye on a connection that
        answers nothing would wait too."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()
            self._abandoned = self._backend
        return RetryableSinkError(
            f"postgres sink {self.id!r}: no answer for {self.query_timeout:g} s (query_timeout_s): "
            "the connection is given up and the batch tried again on a new one"
        )

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close(timeout=5)
            except (OSError, asyncpg.PostgresError, TimeoutError):
                conn.terminate()

    def _keys(self, e: Event, table: str) -> tuple[str, ...]:
        """``key_columns``, else the event's own key (its source table's), else the target table's
        primary key: a change may carry none (a Kafka record whose key is not a JSON object of
        its columns, a source table without a primary key), and ON CONFLICT needs the target's."""
        keys = self.keys or e.source.key or self._target_keys.get(table, ())
        if not keys:
            raise NonRetryableSinkError(
                f"postgres sink {self.id!r}: no key columns for {table}: the event carries none (its "
                "source table has no primary key, or its Kafka record key is not a JSON object of them) "
                "and the target table has no primary key; set key_columns"
            )
        return keys

    def _mark(self, table: str, column: str, i: int) -> str:
        """Parameter ``i`` as the column takes it: natively, or as text cast to its type."""
        cast = self._forms.get(table, {}).get(column, NATIVE_FORM).cast
        return f"${i}" if cast is None else f"${i}::text::{cast}"

    def _args(self, table: str, columns: tuple[str, ...], row: dict[str, Any]) -> tuple[Any, ...]:
        forms = self._forms.get(table, {})
        return tuple(forms.get(c, NATIVE_FORM).adapt(row.get(c)) for c in columns)

    def _upsert_sql(self, table: str, columns: tuple[str, ...], keys: tuple[str, ...]) -> str:
        key = ("u", table, columns, keys)
        sql = self._sql.get(key)
        if sql is None:
            cols = [*columns, self.position_column] if self.if_newer else list(columns)
            marks = ", ".join(
                self._mark(table, c, i) if c in columns else f"${i}" for i, c in enumerate(cols, 1)
            )
            forms = self._forms.get(table, {})
            # An identity column GENERATED ALWAYS takes the source's value only when told to, on
            # insert; an update leaves it as it is (it can only be set to DEFAULT).
            always = {c for c in columns if forms.get(c, NATIVE_FORM).always}
            overriding = " OVERRIDING SYSTEM VALUE" if always else ""
            updates = ", ".join(
                f"{_q(c)} = EXCLUDED.{_q(c)}" for c in cols if c not in keys and c not in always
            )
            action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
            sql = (
                f"INSERT INTO {table} ({', '.join(map(_q, cols))}){overriding} VALUES ({marks}) "
                f"ON CONFLICT ({', '.join(map(_q, keys))}) {action}"
            )
            if self.if_newer and updates:
                pc = _q(self.position_column)
                sql += f" WHERE {table}.{pc} IS NULL OR {table}.{pc} < EXCLUDED.{pc}"
            self._sql[key] = sql
        return sql

    def _delete_sql(self, table: str, keys: tuple[str, ...]) -> str:
        key = ("d", table, keys)
        sql = self._sql.get(key)
        if sql is None:
            where = " AND ".join(f"{_q(k)} = {self._mark(table, k, i)}" for i, k in enumerate(keys, 1))
            if self.if_newer:
                pc = _q(self.position_column)
                where += f" AND ({pc} IS NULL OR {pc} < ${len(keys) + 1})"
            sql = f"DELETE FROM {table} WHERE {where}"
            self._sql[key] = sql
        return sql

    def _statements(self, e: Event) -> list[tuple[str, tuple[Any, ...]]]:
        table = self.table_of(e)
        pos = position_text(e.order)
        if e.op == "t":
            return [(f"TRUNCATE {table}", ())]
        keys = self._keys(e, table)
        if e.op == "d":
            return [self._delete(table, keys, e.before or {}, pos)]
        row = e.after or {}
        out = []
        before = e.before
        moved = e.op == "u" and before and any(k in before and before[k] != row.get(k) for k in keys)
        # A value the change does not carry (unchanged TOAST, a partial MySQL row image): leave it
        # alone; so is a column the target computes itself (a MySQL source logs its virtual ones).
        forms = self._forms.get(table, {})
        columns = tuple(c for c in row if not not_carried(row[c]) and not forms.get(c, NATIVE_FORM).generated)
        if e.op == "u" and any(not_carried(v) for v in row.values()):
            return partial_change(self, table, keys, columns, row, before if moved else None, pos)
        if moved:
            out.append(self._delete(table, keys, before or {}, pos))  # the key changed: the old row goes
        args = self._args(table, columns, row)
        out.append((self._upsert_sql(table, columns, keys), (*args, pos) if self.if_newer else args))
        return out

    def _delete(
        self, table: str, keys: tuple[str, ...], row: dict[str, Any], pos: str
    ) -> tuple[str, tuple[Any, ...]]:
        args = self._args(table, keys, row)
        return self._delete_sql(table, keys), (*args, pos) if self.if_newer else args

    async def _learn(self, conn: asyncpg.Connection, events: list[Event]) -> None:
        """The column types of every target table of ``events`` not read yet."""
        for table in {self.table_of(e) for e in events} - self._forms.keys():
            self._forms[table] = await column_forms(conn, table)
            if self.keys is None:
                self._target_keys[table] = await primary_key(conn, table)

    def _runs(self, events: list[Event]) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """Consecutive changes with the same statement go out together (executemany pipelines
        them); order is kept because runs are cut whenever the statement changes. Tables a
        transaction truncates one after another are truncated in one statement: the source's
        ``TRUNCATE parent CASCADE`` arrives as one truncate per table, and the target refuses to
        truncate a table referenced by a foreign key unless the referencing one goes with it."""
        runs: list[tuple[str, list[tuple[Any, ...]]]] = []
        truncating: Event | None = None  # the truncate the last run ends with
        for e in events:
            if e.op == "t" and truncating is not None and truncating.tx_id == e.tx_id:
                runs[-1] = (f"{runs[-1][0]}, {self.table_of(e)}", [()])
                continue
            truncating = e if e.op == "t" else None
            for sql, args in self._statements(e):
                if runs and runs[-1][0] == sql and args:
                    runs[-1][1].append(args)
                else:
                    runs.append((sql, [args]))
        return runs

    def _forget(self) -> None:
        self._forms.clear()
        self._target_keys.clear()
        self._sql.clear()

    @staticmethod
    async def _apply(conn: asyncpg.Connection, runs: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """``runs`` in one transaction. A statement given up (``TimeoutError``) gives the
        connection up without a ROLLBACK: on a connection that answers nothing that waited as
        long again, and asyncpg, ending the connection meanwhile for its unanswered cancel, could
        fail it as ``connection is closed``, taken for an ordinary refusal."""
        tx = conn.transaction()
        await tx.start()
        try:
            for sql, rows in runs:
                if rows == [()]:
                    await conn.execute(sql)
                else:
                    await conn.executemany(sql, rows)
        except TimeoutError:
            raise  # the connection is given up (deliver): the server ends the transaction with it
        except BaseException:
            await tx.rollback()
            raise
        await tx.commit()

    async def deliver(self, events: list[Event], position: Position | None = None) -> None:
        if self._conn is None or self._conn.is_closed():
            await self.open()
        conn = self._conn
        assert conn is not None
        try:
            await self._learn(conn, events)
            await self._apply(conn, self._runs(events))
        except TimeoutError:  # asyncpg's command_timeout: see open()
            self._forget()
            raise self._unanswered() from None
        except _REFUSED as exc:
            self._forget()  # the target may have been altered: its types are read again first
            raise PoisonEvent(f"postgres sink {self.id!r}: {type(exc).__name__}: {exc}", "rejected") from None
        except _PERMANENT as exc:
            self._forget()
            raise NonRetryableSinkError(f"postgres sink {self.id!r}: {type(exc).__name__}: {exc}") from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            self._forget()
            if isinstance(exc, asyncpg.ObjectNotInPrerequisiteStateError) and "deferrable" in str(exc):
                raise NonRetryableSinkError(  # a target made from a source whose key is DEFERRABLE
                    f"postgres sink {self.id!r}: the target's key is DEFERRABLE, and INSERT … ON CONFLICT "
                    f"cannot use such a key ({exc}); make the key NOT DEFERRABLE in the target (drop the "
                    "constraint and add it again without DEFERRABLE)"
                ) from None
            await self.close()
            raise RetryableSinkError(f"postgres sink {self.id!r}: {type(exc).__name__}: {exc}") from None
