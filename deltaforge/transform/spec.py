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
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from deltaforge.configmodel import Hint, PluginConfig, PositiveInt, Text, fail

PROCESSOR_TYPES = ("filter", "mask", "sql")
MASK_ACTIONS = ("hash", "redact", "drop")
REDACTED = "***"


@dataclass(frozen=True, slots=True)
class ProcessorSpec:
    """One processor as the planner sees it; ``path`` (``spec.processors[1]``) names it in every error."""

    type: str
    path: str
    tables: tuple[str, ...] | None = None
    expr: str = ""
    query: str = ""
    columns: tuple[tuple[str, str], ...] = ()

    def applies_to(self, db: str, table: str) -> bool:
        """Whether this processor's ``tables:`` scope covers ``db.table``."""
        return self.tables is None or table in self.tables or f"{db}.{table}" in self.tables


def _scope(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(t, str) and t for t in value):
        fail(f"expected a non-empty list of table names, got {value!r}")
    return list(value)


def _action(value: Any) -> str:
    if value not in MASK_ACTIONS:
        fail(f"expected one of {', '.join(MASK_ACTIONS)}, got {value!r}")
    return str(value)


def _columns(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        fail("required (a mapping of column: hash|redact|drop)")
    return value


Scope = Annotated[list[str], BeforeValidator(_scope), Hint("a non-empty list of table names")]
MaskAction = Annotated[Literal["hash", "redact", "drop"], BeforeValidator(_action)]
MaskColumns = Annotated[
    dict[str, MaskAction], BeforeValidator(_columns), Hint("a mapping of column: hash|redact|drop")
]


class FilterProcessor(PluginConfig):
    """Keeps the events for which a Spark SQL boolean expression is true."""

    type: Literal["filter"]
    expr: Text = Field(
        description="Spark SQL over op, db, table, before.* and after.*, e.g. after.amount > 100."
    )
    tables: Scope | None = Field(None, description="Only these tables (table or db.table); default: all.")


class MaskProcessor(PluginConfig):
    """Rewrites columns of the row images."""

    type: Literal["mask"]
    columns: MaskColumns = Field(description="column: hash (SHA-256 hex), redact (***) or drop.")
    tables: Scope | None = Field(None, description="Only these tables (table or db.table); default: all.")


class SqlProcessor(PluginConfig):
    """A Spark SQL query over the view ``batch`` that returns event rows (with ``_seq``)."""

    type: Literal["sql"]
    query: Text = Field(description="SELECT ... FROM batch; must return _seq.")
    tables: Scope | None = Field(None, description="Only these tables (table or db.table); default: all.")


ProcessorModel = FilterProcessor | MaskProcessor | SqlProcessor
PROCESSORS: dict[str, type[ProcessorModel]] = {
    "filter": FilterProcessor,
    "mask": MaskProcessor,
    "sql": SqlProcessor,
}


def processor_spec(model: ProcessorModel, path: str) -> ProcessorSpec:
    """The planner's view of a validated processor."""
    tables = tuple(model.tables) if model.tables is not None else None
    if isinstance(model, FilterProcessor):
        return ProcessorSpec("filter", path, tables, expr=model.expr)
    if isinstance(model, SqlProcessor):
        return ProcessorSpec("sql", path, tables, query=model.query)
    return ProcessorSpec("mask", path, tables, columns=tuple(model.columns.items()))


def _master(value: str) -> str:
    if not (value.startswith("local") or value.startswith("spark://")):
        fail(f"expected local, local[N], local[*] or spark://host:port, got {value!r}")
    return value


def _conf_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str | int | float):
        fail(f"expected a string or number, got {value!r}")
    return str(value)


ConfText = Annotated[str, BeforeValidator(_conf_text)]


class SparkConfig(PluginConfig):
    """``spec.spark``: where jobs run and how many run at once."""

    master: Annotated[Text, AfterValidator(_master)] = Field(
        "local[*]", description="local, local[N], local[*] or spark://host:port."
    )
    conf: dict[str, ConfText] = Field(default_factory=dict, description="Spark settings, passed as given.")
    threads: PositiveInt = Field(2, description="Jobs that may run at once in this process.")
    app_name: Text = Field("deltaforge", description="The Spark application name.")
    max_job_events: PositiveInt = Field(
        10_000,
        description="Batches queued behind busy jobs are sent together, up to this many events per job.",
    )
