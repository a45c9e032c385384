"""Plan: a pipeline's processors as Spark DataFrame operations, checked and run.

``analyse`` builds the plan over an empty table of each captured table's schema
before any event flows: a bad expression, an unknown column or a query that does
not return event rows is refused there, with the processor's path. ``run``
transforms one batch: one Spark job per source table in it, Arrow in and out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaforge.events import Event
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
from deltaforge.transform.session import SparkRuntime
from deltaforge.transform.spec import REDACTED, ProcessorSpec
from supervision import Fatal

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

IMAGES = ("before", "after")


class ProcessorError(Fatal):
    """A processor cannot work on a table: retrying will not help, the pipeline halts."""


@dataclass(frozen=True, slots=True)
class Transformed:
    """One batch's events after the processors, and what it cost."""

    events: list[Event]
    jobs: int
    seconds: float


class Plan:
    """The processors of one pipeline against the schemas of its tables."""

    def __init__(self, processors: tuple[ProcessorSpec, ...], schemas: list[TableSchema]) -> None:
        self.processors = processors
        self.schemas = {(s.db, s.table): s for s in schemas}

    # -- at start --------------------------------------------------------------
    def analyse(self, spark: SparkSession) -> None:
        """Refuse, with the processor's path, anything Spark cannot analyse for some table."""
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
            df = spark.createDataFrame(empty_table(schema))
            self._apply(spark, df, schema.db, schema.table)

    # -- per batch (in a worker thread) -------------------------------------------
    def run(self, runtime: SparkRuntime, events: list[Event]) -> Transformed:
        """The batch's events after every processor, in source order."""
        started = time.perf_counter()
        spark = runtime.job_session()
        parts: list[list[tuple[int, Event]]] = [[(i, e) for i, e in enumerate(events) if e.op == "h"]]
        jobs = 0
        for (db, table), indices in group_by_table(events).items():
            if not any(p.applies_to(db, table) for p in self.processors):
                parts.append([(i, events[i]) for i in indices])
                continue
            sent = to_arrow(events, indices, self.schemas.get((db, table)))
            df = self._apply(spark, spark.createDataFrame(sent.table), db, table)
            result = df.toArrow()
            jobs += 1
            parts.append(from_arrow(result, events, sent, path=f"processors ({db}.{table})"))
        return Transformed(merge_in_order(parts), jobs, time.perf_counter() - started)

    def _apply(self, spark: SparkSession, df: DataFrame, db: str, table: str) -> DataFrame:
        from pyspark.errors import AnalysisException

        for p in self.processors:
            if not p.applies_to(db, table):
                continue
            try:
                df = _step(spark, df, p)
            except (AnalysisException, NoSuchColumn) as exc:
                field = {"filter": "expr", "sql": "query", "mask": "columns"}[p.type]
                raise ProcessorError(f"{p.path}.{field}: {_first_line(exc)} (table {db}.{table})") from None
            columns = set(df.columns)
            if SEQ not in columns or not columns <= set(EVENT_COLUMNS):
                raise ProcessorError(
                    f"{p.path}: must return event rows: {SEQ} and any of "
                    f"{', '.join(EVENT_COLUMNS[1:])}; got {', '.join(df.columns)} (table {db}.{table})"
                )
        return df


def _step(spark: SparkSession, df: DataFrame, p: ProcessorSpec) -> DataFrame:
    if p.type == "filter":
        return df.filter(p.expr)
    if p.type == "sql":
        session = df.sparkSession
        df.createOrReplaceTempView("batch")
        return session.sql(p.query)
    return _mask(df, p)


def _mask(df: DataFrame, p: ProcessorSpec) -> DataFrame:
    from pyspark.sql import functions as F

    for image in IMAGES:
        if image not in df.columns:
            continue
        fields = set(df.schema[image].dataType.fieldNames())  # type: ignore[attr-defined]
        struct: Column = F.col(image)
        for column, action in p.columns:
            if column not in fields:
                if p.tables is not None:  # named tables must have it; unscoped masks apply where it exists
                    raise _missing(p, column, sorted(fields))
                continue
            value = struct.getField(column)
            if action == "drop":
                struct = struct.dropFields(column)
            elif action == "hash":
                struct = struct.withField(column, F.sha2(value.cast("string"), 256))
            else:
                struct = struct.withField(column, F.when(value.isNull(), None).otherwise(F.lit(REDACTED)))
        # A missing row image (before of an insert) stays missing rather than becoming a struct of nulls.
        df = df.withColumn(image, F.when(F.col(image).isNull(), None).otherwise(struct))
    return df


class NoSuchColumn(Exception):
    """A mask names a column that a table in its ``tables:`` scope does not have."""


def _missing(p: ProcessorSpec, column: str, fields: list[str]) -> Exception:
    return NoSuchColumn(f"no column {column!r}; the table has {', '.join(fields)}")


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
