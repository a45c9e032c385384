"""Arrow tables into Spark and back, releasing every JVM object a job made as soon as it is done.

This is what ``SparkSession.createDataFrame(pa.Table)`` and ``DataFrame.toArrow()``
do in pyspark 4, step for step and with pyspark's own helpers, with one
difference: the py4j handles they create are kept in a :class:`JobHandles` and
released when the job ends.

Why: py4j proxies sit in reference cycles (a ``JavaObject`` caches its
``JavaMember`` s, which point back at it), so the JVM keeps what they reference
until Python's cyclic collector runs: the batch's Arrow data, three times over
(the stream read from Python, the DataFrame over it, the server that sent the
result back). A full ``gc.collect()`` once a second kept the heap flat but cost
100-200 ms of GIL per second with batches in flight, a fifth of all Python time
in the pipeline benchmark. Releasing the handles costs one py4j message each.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class JobHandles:
    """The JVM objects one job created; :meth:`release` lets the JVM free them all now."""

    def __init__(self) -> None:
        self._objects: list[Any] = []

    def keep(self, obj: Any) -> Any:
        self._objects.append(obj)
        return obj

    def release(self) -> None:
        objects, self._objects = self._objects, []
        for obj in objects:
            with contextlib.suppress(Exception):  # a dead gateway frees everything anyway
                obj._detach()


@dataclass(frozen=True, slots=True)
class ArrowConf:
    """What ``createDataFrame`` looks up on every call, looked up once per session here.

    Every py4j call is a round trip to the JVM, and under load each one also waits
    for the GIL on the way back: a job went from 20 round trips to 12.
    """

    timezone: str
    prefer_timestamp_ntz: bool
    large_var_types: bool
    max_records_per_batch: int
    read_arrow_file: Any = field(compare=False)
    to_dataframe: Any = field(compare=False)
    """``PythonSQLUtils``' two static methods (finding a class, then a method, costs round trips)."""
    views: TempViews = field(compare=False)
    """This session's temporary views, rebound per batch without a SQL command."""

    @staticmethod
    def of(spark: SparkSession) -> ArrowConf:
        conf = spark.conf
        jvm: Any = spark._jvm
        return ArrowConf(
            timezone=str(conf.get("spark.sql.session.timeZone")),
            prefer_timestamp_ntz=conf.get("spark.sql.timestampType") == "TIMESTAMP_NTZ",
            large_var_types=conf.get("spark.sql.execution.arrow.useLargeVarTypes") == "true",
            max_records_per_batch=int(str(conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))),
            read_arrow_file=jvm.PythonSQLUtils.readArrowStreamFromFile,
            to_dataframe=jvm.PythonSQLUtils.toDataFrame,
            views=TempViews(spark),
        )


class TempViews:
    """Binds a session's temporary views to each batch's DataFrame.

    ``createOrReplaceTempView`` runs ``CreateViewCommand`` as a SQL execution of
    its own (an execution id, listener events, its plan explained as text) on
    every batch: 5-7 ms of a 10k-event job's 90. What the command leaves in the
    catalog is the view's metadata (name, schema) and the DataFrame's analysed
    plan. The first batch of a ``key`` (the caller's: whatever fixes the view's
    schema) runs the command; later ones put the metadata it made and their own
    plan into the catalog directly (``SessionCatalog.createTempView``, four
    round trips: 0.5 ms a batch in the benchmark). Internal Spark API: pyspark is pinned, and
    ``tests/test_transform_types.py`` counts the SQL executions a batch makes.
    """

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = spark._jvm
        self._catalog = spark._jsparkSession.sessionState().catalog()
        self._relation = jvm.org.apache.spark.sql.catalyst.catalog.TemporaryViewRelation
        self._some = jvm.scala.Some
        self._metadata: dict[tuple[str, Any], Any] = {}

    def bind(self, df: DataFrame, name: str, key: Any, handles: JobHandles) -> None:
        """``df.createOrReplaceTempView(name)`` for a DataFrame whose schema ``key`` determines."""
        metadata = self._metadata.get((name, key))
        if metadata is None:
            df.createOrReplaceTempView(name)
            self._metadata[(name, key)] = self._catalog.getRawTempView(name).get().tableMeta()
            return
        plan = handles.keep(df._jdf.logicalPlan())
        relation = handles.keep(self._relation(metadata, handles.keep(self._some(plan))))
        self._catalog.createTempView(name, relation, True)


def arrow_schema(spark_schema: Any, conf: ArrowConf) -> pa.Schema:
    """The Arrow schema pyspark converts a Spark schema to, both into Spark and out of it."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(
        spark_schema,
        error_on_duplicated_field_names_in_struct=True,
        timezone="UTC",
        prefers_large_types=conf.large_var_types,
    )


def to_spark(spark: SparkSession, conf: ArrowConf, table: pa.Table, handles: JobHandles) -> DataFrame:
    """``spark.createDataFrame(table)``, its JVM objects kept in ``handles``."""
    from pyspark.sql.dataframe import DataFrame
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.sql.pandas.types import _check_arrow_table_timestamps_localize, from_arrow_schema

    schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=conf.prefer_timestamp_ntz)
    if schema.fields:
        target = arrow_schema(schema, conf)
        table = _check_arrow_table_timestamps_localize(table, schema, True, conf.timezone)
        if table.schema != target:
            table = table.cast(target)
    jvm: Any = spark._jvm
    jbatches = handles.keep(
        spark.sparkContext._serialize_to_jvm(
            table.to_batches(max_chunksize=conf.max_records_per_batch),
            ArrowStreamSerializer(),
            conf.read_arrow_file,
            lambda: jvm.ArrowIteratorServer(),  # only with spark.io.encryption
        )
    )
    jdf = handles.keep(conf.to_dataframe(jbatches, schema.json(), spark._jsparkSession))
    df = DataFrame(jdf, spark)
    df._schema = schema
    return df


def sql(spark: SparkSession, query: str, handles: JobHandles) -> DataFrame:
    """``spark.sql(query)``, its Dataset kept in ``handles``.

    One py4j call: ``spark.sql`` makes three more to pass its (here empty) query arguments.
    """
    from pyspark.sql.dataframe import DataFrame

    jdf = handles.keep(spark._jsparkSession.sql(query))
    return DataFrame(jdf, spark)


def from_spark(df: DataFrame, schema: pa.Schema, handles: JobHandles) -> pa.Table:
    """``df.toArrow()`` for a result known to have Arrow ``schema`` (as ``toArrow`` would cast it)."""
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.util import _load_from_socket

    # (toArrow also records the caller's stack as the job's call site, for Spark's UI, which is off:
    # traceback.extract_stack showed up in profiles)
    reply = handles.keep(df._jdf.collectAsArrowToPython())
    port, secret, server = reply[0], reply[1], handles.keep(reply[2])
    try:
        with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
            batches = list(stream)
    finally:
        with unwrap_spark_exception():
            server.getResult()  # joins the serving thread; raises the job's error
    if not batches:
        return schema.empty_table()
    table = pa.Table.from_batches(batches)
    return table if table.schema == schema else table.cast(schema)


__all__ = ["ArrowConf", "JobHandles", "arrow_schema", "from_spark", "sql", "to_spark"]
