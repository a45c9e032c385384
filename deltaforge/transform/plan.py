"""Plan: a pipeline's processors as Spark SQL, checked and run.

``analyse`` compiles the processors over an empty table of each captured
table's schema before any event flows: a bad expression, an unknown column or a
query that does not return event rows is refused there, with the processor's
path. ``run`` transforms one batch: one Spark job per source table in it, Arrow
in and out. Compiled SQL is cached per table and Arrow schema, so a steady
stream is analysed once per query, not once per processor call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltaforge.events import Event
from deltaforge.transform import jvmio, markers
from deltaforge.transform.arrow import (
    EVENT_COLUMNS,
    SEQ,
    TableSchema,
    TransformError,
    empty_table,
    from_arrow,
    group_by_table,
    merge_in_order,
    to_arrow,
)
from deltaforge.transform.changes import Changes, changes_of
from deltaforge.transform.jvmio import ArrowConf, JobHandles, from_spark, to_spark
from deltaforge.transform.session import SparkRuntime
from deltaforge.transform.spec import ProcessorSpec
from deltaforge.transform.sqlgen import (
    BATCH_VIEW,
    IMAGES,
    IN_VIEW,
    base_query,
    filter_query,
    mask_query,
)
from supervision import Fatal

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class ProcessorError(Fatal):
    """A processor cannot work on a table: retrying will not help, the pipeline halts."""


@dataclass(frozen=True, slots=True)
class Compiled:
    """One table's processors as SQL: register the batch as ``view``, run ``query``, repeat.

    ``changes`` is set for chains without ``sql``: the last query then returns only
    ``_seq`` and masked values, which ``changes.apply`` puts into the events.
    """

    steps: tuple[tuple[str, str], ...]
    result: pa.Schema
    """The Arrow schema the last query returns."""
    changes: Changes | None = None


@dataclass(frozen=True, slots=True)
class Transformed:
    """Events after the processors, each with its index in the input, and what it cost."""

    kept: list[tuple[int, Event]]
    jobs: int
    seconds: float

    @property
    def events(self) -> list[Event]:
        return [e for _, e in self.kept]

    def split(self, sizes: list[int]) -> list[list[Event]]:
        """The kept events of each of several batches sent as one (``sizes`` events each, in order)."""
        out: list[list[Event]] = []
        kept, i = self.kept, 0
        end = 0
        for size in sizes:
            end += size
            part: list[Event] = []
            while i < len(kept) and kept[i][0] < end:
                part.append(kept[i][1])
                i += 1
            out.append(part)
        return out


class Plan:
    """The processors of one pipeline against the schemas of its tables."""

    def __init__(self, processors: tuple[ProcessorSpec, ...], schemas: list[TableSchema]) -> None:
        self.processors = processors
        self.schemas = {(s.db, s.table): s for s in schemas}
        self._compiled: dict[tuple[str, str, pa.Schema], Compiled] = {}

    # -- at start --------------------------------------------------------------
    def analyse(self, runtime: SparkRuntime) -> None:
        """Refuse, with the processor's path, anything Spark cannot analyse for some table.

        Runs in this thread's own child session: pipelines starting together analyse
        at the same time, and in one shared session their views would overwrite each
        other's (a bad processor was once checked against another table and passed).
        """
        spark = runtime.job_session()
        with runtime.analysis_lock:
            self._analyse(spark, runtime.arrow_conf())

    def _analyse(self, spark: SparkSession, conf: ArrowConf) -> None:
        for p in self.processors:
            _parse_check(spark, p)
        for p in self.processors:
            if p.type == "mask" and self.schemas:
                in_scope = [s for s in self.schemas.values() if p.applies_to(s.db, s.table)]
                for column, _ in p.columns:
                    if in_scope and not any(column in s.names for s in in_scope):
                        raise ProcessorError(
                            f"{p.path}.columns.{column}: no such column in "
                            + ", ".join(f"{s.db}.{s.table}" for s in in_scope)
                        )
        for schema in self.schemas.values():
            self.compile(spark, conf, schema.db, schema.table, empty_table(schema).schema)

    def compile(
        self, spark: SparkSession, conf: ArrowConf, db: str, table: str, arrow_schema: pa.Schema
    ) -> Compiled:
        """The SQL steps for one table's batches of this Arrow schema (cached: analysed once)."""
        key = (db, table, arrow_schema)
        cached = self._compiled.get(key)
        if cached is None:
            cached = self._compile(spark, conf, db, table, arrow_schema)
            self._compiled[key] = cached
        return cached

    def _compile(
        self, spark: SparkSession, conf: ArrowConf, db: str, table: str, arrow_schema: pa.Schema
    ) -> Compiled:
        from pyspark.errors import AnalysisException

        current = spark.createDataFrame(arrow_schema.empty_table())
        current.createOrReplaceTempView(IN_VIEW)
        steps: list[tuple[str, str]] = []
        query = base_query()
        result = current
        has_sql = False
        masked: list[str] = []
        unmasked = query  # the chain before the masks that end it
        trailing: list[dict[str, str]] = []  # those masks' actions
        for p in self.processors:
            if not p.applies_to(db, table):
                continue
            if p.type == "mask":
                masked += [column for column, action in p.columns if action != "drop"]
                trailing.append(dict(p.columns))
            else:
                trailing = []
            has_sql = has_sql or p.type == "sql"
            try:
                if p.type == "sql":
                    if query != base_query():
                        steps.append((IN_VIEW, query))
                        current = spark.sql(query)
                    current.createOrReplaceTempView(BATCH_VIEW)
                    steps.append((BATCH_VIEW, p.query))
                    current = spark.sql(p.query)
                    current.createOrReplaceTempView(IN_VIEW)
                    query = base_query()
                    result = current
                elif p.type == "filter":
                    query = unmasked = filter_query(query, p.expr)
                    result = spark.sql(query)
                else:
                    query = _mask(spark.sql(query).schema, query, p)
                    result = spark.sql(query)
            except (AnalysisException, NoSuchColumn) as exc:
                field = {"filter": "expr", "sql": "query", "mask": "columns"}[p.type]
                raise ProcessorError(f"{p.path}.{field}: {_first_line(exc)} (table {db}.{table})") from None
            columns = set(result.columns)
            if SEQ not in columns or not columns <= set(EVENT_COLUMNS):
                raise ProcessorError(
                    f"{p.path}: must return event rows: {SEQ} and any of "
                    f"{', '.join(EVENT_COLUMNS[1:])}; got {', '.join(result.columns)} (table {db}.{table})"
                )
        if has_sql:
            if query != base_query():
                steps.append((IN_VIEW, query))
            return Compiled(tuple(steps), jvmio.arrow_schema(result.schema, conf))
        changes = changes_of(arrow_schema.field("after").type, result.schema, masked)
        narrow = changes.query(unmasked, tuple(trailing))
        return Compiled(((IN_VIEW, narrow),), jvmio.arrow_schema(spark.sql(narrow).schema, conf), changes)

    # -- per batch (in a worker thread) -------------------------------------------
    def run(self, runtime: SparkRuntime, events: list[Event]) -> Transformed:
        """The events after every processor, in source order (one Spark job per table)."""
        started = time.perf_counter()
        spark = runtime.job_session()
        conf = runtime.arrow_conf()
        tables, heartbeats = group_by_table(events)
        parts: list[list[tuple[int, Event]]] = [[(i, events[i]) for i in heartbeats]]
        jobs = 0
        for (db, table), indices in tables.items():
            if not any(p.applies_to(db, table) for p in self.processors):
                parts.append([(i, events[i]) for i in indices])
                continue
            schema = self.schemas.get((db, table))
            given, sent = events, to_arrow(events, indices, schema)
            carried: markers.Carried = {}
            if sent.json:  # a column went as JSON text: a marker does that to a text column
                given, carried = markers.strip(events, indices)
                if carried:
                    sent = to_arrow(given, indices, schema)
            compiled = self._compiled.get((db, table, sent.table.schema))
            if compiled is None:
                with runtime.analysis_lock:
                    compiled = self.compile(spark, conf, db, table, sent.table.schema)
            handles = JobHandles()
            try:
                df = to_spark(spark, conf, sent.table, handles)
                for step, (view, query) in enumerate(compiled.steps):
                    conf.views.bind(df, view, (sent.table.schema, compiled.steps, step), handles)
                    df = jvmio.sql(spark, query, handles)
                result = from_spark(df, compiled.result, handles)
            finally:
                handles.release()
            jobs += 1
            path = f"processors ({db}.{table})"
            if compiled.changes is not None:
                part = compiled.changes.apply(result, given, sent, path)
            else:
                part = from_arrow(result, given, sent, path)
            parts.append(markers.restore(part, carried))
        return Transformed(merge_in_order(parts), jobs, time.perf_counter() - started)


def _mask(schema: Any, query: str, p: ProcessorSpec) -> str:
    columns = dict(p.columns)
    if p.tables is not None:  # named tables must have the column; unscoped masks apply where it exists
        for image in IMAGES:
            if image in schema.fieldNames():
                fields = schema[image].dataType.fieldNames()
                for column in columns:
                    if column not in fields:
                        raise NoSuchColumn(f"no column {column!r}; the table has {', '.join(fields)}")
    return mask_query(query, schema, columns)


class NoSuchColumn(Exception):
    """A mask names a column that a table in its ``tables:`` scope does not have."""


def _parse_check(spark: SparkSession, p: ProcessorSpec) -> None:
    """Syntax errors are found even for tables whose schema is not known yet."""
    parser: Any = spark._jsparkSession.sessionState().sqlParser()
    try:
        if p.type == "filter":
            parser.parseExpression(p.expr)
        elif p.type == "sql":
            parser.parsePlan(p.query)
    except Exception as exc:  # noqa: BLE001 - py4j wraps the parser's error; its text is what matters
        field = "expr" if p.type == "filter" else "query"
        raise ProcessorError(f"{p.path}.{field}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if "ParseException:" in text:
        text = text.split("ParseException:", 1)[1].strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(exc).__name__
    return head.split("; line ")[0] if "SQLSTATE" in head else head


__all__ = ["Plan", "ProcessorError", "TransformError", "Transformed"]
