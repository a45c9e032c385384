"""Processor and Spark settings: what ``spec.processors`` and ``spec.spark`` say, checked.

Processors run in order on every batch, on Spark (see ``deltaforge/pipeline/transformer.py``):

``filter``  keeps the events for which a Spark SQL boolean expression over ``op``,
            ``db``, ``table``, ``before.*`` and ``after.*`` is true.
``mask``    rewrites columns of the row images: ``hash`` (SHA-256 hex of the value as
            text), ``redact`` (the text ``***``) or ``drop`` (the column is removed).
``sql``     a Spark SQL query over the view ``batch`` that returns event rows: it must
            return ``_seq``; ``op``, ``before`` and ``after`` it returns replace the event's.

Each may be scoped with ``tables:`` (``table`` or ``db.table`` names). This module only
checks the shape; expressions are analysed by Spark against the tables' schemas when
the pipeline starts (``deltaforge/transform/plan.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltaforge.configcheck import Checker

PROCESSOR_TYPES = ("filter", "mask", "sql")
MASK_ACTIONS = ("hash", "redact", "drop")
REDACTED = "***"


@dataclass(frozen=True, slots=True)
class ProcessorSpec:
    """One processor; ``path`` (``spec.processors[1]``) names it in every error."""

    type: str
    path: str
    tables: tuple[str, ...] | None = None
    expr: str = ""
    query: str = ""
    columns: tuple[tuple[str, str], ...] = ()

    def applies_to(self, db: str, table: str) -> bool:
        """Whether this processor's ``tables:`` scope covers ``db.table``."""
        return self.tables is None or table in self.tables or f"{db}.{table}" in self.tables


@dataclass(frozen=True, slots=True)
class SparkConfig:
    """``spec.spark``: where jobs run and how many run at once."""

    master: str = "local[*]"
    conf: tuple[tuple[str, str], ...] = ()
    threads: int = 2
    app_name: str = "deltaforge"
    max_job_events: int = 10_000
    """Batches queued behind busy jobs are sent together, up to this many events per job."""


def parse_processors(c: Checker, raw: Any) -> tuple[ProcessorSpec, ...]:
    """``spec.processors``: a list of ``{type: filter|mask|sql, ...}`` mappings."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.err("spec.processors", f"expected a list of processors, got {type(raw).__name__}")
        return ()
    return tuple(p for i, item in enumerate(raw) if (p := _processor(c, item, f"spec.processors[{i}]")))


def _processor(c: Checker, raw: Any, path: str) -> ProcessorSpec | None:
    m = c.mapping(raw, path)
    if not m:
        return None
    typ = m.get("type")
    if typ not in PROCESSOR_TYPES:
        c.err(f"{path}.type", f"expected one of {', '.join(PROCESSOR_TYPES)}, got {typ!r}")
        return None
    tables = _tables(c, m.get("tables"), f"{path}.tables")
    if typ == "filter":
        c.unknown(m, path, {"type", "expr", "tables"})
        return ProcessorSpec("filter", path, tables, expr=c.string(m, "expr", path))
    if typ == "sql":
        c.unknown(m, path, {"type", "query", "tables"})
        return ProcessorSpec("sql", path, tables, query=c.string(m, "query", path))
    c.unknown(m, path, {"type", "columns", "tables"})
    cols = m.get("columns")
    if not isinstance(cols, dict) or not cols:
        c.err(f"{path}.columns", "required (a mapping of column: hash|redact|drop)")
        return None
    for col, action in cols.items():
        if action not in MASK_ACTIONS:
            c.err(f"{path}.columns.{col}", f"expected one of {', '.join(MASK_ACTIONS)}, got {action!r}")
    return ProcessorSpec("mask", path, tables, columns=tuple((str(k), str(v)) for k, v in cols.items()))


def _tables(c: Checker, raw: Any, path: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) and t for t in raw):
        c.err(path, f"expected a non-empty list of table names, got {raw!r}")
        return None
    return tuple(raw)


def parse_spark(c: Checker, raw: Any) -> SparkConfig:
    """``spec.spark``: ``master`` (``local[*]`` or ``spark://host:port``), ``conf``, ``threads``,
    ``max_job_events``."""
    m = c.mapping(raw, "spec.spark", required=False)
    c.unknown(m, "spec.spark", {"master", "conf", "threads", "app_name", "max_job_events"})
    master = c.string(m, "master", "spec.spark", default="local[*]")
    if master and not (master.startswith("local") or master.startswith("spark://")):
        c.err("spec.spark.master", f"expected local, local[N], local[*] or spark://host:port, got {master!r}")
    conf = c.mapping(m.get("conf"), "spec.spark.conf", required=False)
    for key, value in conf.items():
        if not isinstance(value, str | int | float | bool):
            c.err(f"spec.spark.conf.{key}", f"expected a string or number, got {value!r}")
    return SparkConfig(
        master=master,
        conf=tuple((str(k), _conf_text(v)) for k, v in conf.items()),
        threads=c.integer(m, "threads", "spec.spark", 2, 1),
        app_name=c.string(m, "app_name", "spec.spark", default="deltaforge"),
        max_job_events=c.integer(m, "max_job_events", "spec.spark", 10_000, 1),
    )


def _conf_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
