"""SparkRuntime: the process's one SparkSession, started on first use and kept warm.

A SparkSession costs 13-22 s to start on two cores, so it is started once, by
the first pipeline that has processors, and outlives restarts of the
SparkTransformer actor. A session whose JVM died is noticed by :meth:`ensure`
(the actor calls it on every start) and replaced by a fresh one.

Jobs run in this runtime's own thread pool. Each pool thread works in its own
child session (``newSession()``: same JVM and SparkContext, separate temporary
views) so that concurrent batches never see each other's ``batch`` view.

Everything here blocks: call it from a worker thread, never from the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaforge import gctune
from deltaforge.transform.jvmio import ArrowConf
from deltaforge.transform.spec import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J = Path(__file__).with_name("log4j2.properties")

# Settings a user may override with spec.spark.conf.
DEFAULT_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Naive timestamps go in and come back as the same wall-clock time.
    "spark.sql.session.timeZone": "UTC",
    # Adaptive execution re-plans after each stage: pure cost for batches this small
    # (measured 5-20 ms per job on 1k-10k rows).
    "spark.sql.adaptive.enabled": "false",
    # Below this size createDataFrame(arrow) makes a LocalRelation, which the optimizer then
    # filters and projects row by row, interpreted, in the py4j thread, copying every row twice.
    # As an RDD of Arrow batches the same query runs as generated code in a task: measured on a
    # warm session, filter + mask on 10k rows, JVM CPU per job 144 ms -> 74 ms, p50 152 -> 95 ms.
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    # G1's default 1 MB regions make every Arrow buffer over 512 KB a "humongous" object, and
    # each humongous allocation may start a collection: a 10k-event batch job triggered one
    # every ~3 batches (400 warm batches: 75-81 young pauses, 520 ms in all, up to 16 ms each).
    # With 16 MB regions: 0-7 pauses.
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J} -XX:G1HeapRegionSize=16m",
    # In local mode the jobs run inside the driver JVM: 1g (Spark's default) ran out with
    # four 10k-event jobs in flight.
    "spark.driver.memory": "2g",
    # Spark keeps the last 1000 jobs, stages and SQL executions for its UI even with the UI off:
    # in a service running a job per batch that is heap and listener work for nothing.
    "spark.ui.retainedJobs": "20",
    "spark.ui.retainedStages": "20",
    "spark.ui.retainedTasks": "200",
    "spark.sql.ui.retainedExecutions": "20",
    # Every SQL execution's plan goes to the (off) UI's listener as text; "formatted", the
    # default, is the costlier rendering. Measured on 10k-event jobs: 0-2 ms of ~80 a batch.
    "spark.sql.ui.explainMode": "simple",
}


class SparkUnavailable(Exception):
    """pyspark or Java is missing, or the session could not start."""


class SparkRuntime:
    """Owns one SparkSession and the thread pool its jobs run in."""

    def __init__(self, config: SparkConfig) -> None:
        self.config = config
        self.pool = ThreadPoolExecutor(config.threads, thread_name_prefix="spark-job")
        self.starts = 0
        self.users = 0
        self._session: SparkSession | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self.analysis_lock = threading.Lock()
        """Held while processors are analysed or compiled (rare): one at a time."""
        self._local = threading.local()

    def ensure(self) -> SparkSession:
        """The live session: started if there is none, replaced if its JVM died."""
        with self._lock:
            session = self._session
            if session is not None and _alive(session):
                return session
            if session is not None:
                self._forget(session)
            self._session = self._start()
            self._generation += 1
            self.starts += 1
            return self._session

    def job_session(self) -> SparkSession:
        """This thread's child session (its own temp views) of the current session."""
        session = self._session
        if session is None:
            raise SparkUnavailable("the Spark session is not started")
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            with self._lock:  # one JVM-side session creation at a time
                local.session = session.newSession()
                local.conf = ArrowConf.of(local.session)
            local.generation = self._generation
        child: SparkSession = local.session
        return child

    def arrow_conf(self) -> ArrowConf:
        """The Arrow settings of this thread's child session (read once, when it was made)."""
        conf: ArrowConf = self._local.conf
        return conf

    def jvm_pid(self) -> int | None:
        """The driver JVM's process id, when a session is up."""
        session = self._session
        if session is None:
            return None
        jvm: Any = session.sparkContext._jvm
        with contextlib.suppress(Exception):
            return int(jvm.java.lang.ProcessHandle.current().pid())
        return None

    def alive(self) -> bool:
        """Whether the session's JVM still answers (blocks briefly)."""
        session = self._session
        return session is not None and _alive(session)

    def stop(self) -> None:
        """Stop the session (the JVM goes with the process)."""
        with self._lock:
            if self._session is not None:
                self._forget(self._session)
                self._session = None

    def _start(self) -> SparkSession:
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise SparkUnavailable(
                "processors need pyspark: install deltaforge with the spark extra "
                "(pip install 'deltaforge[spark]') and a Java 17 runtime"
            ) from exc
        # Workers of a cluster start this interpreter (and its packages) for Python code.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        _quiet_python_side()
        cfg = self.config
        conf = {**DEFAULT_CONF, **dict(cfg.conf)}
        builder: Any = SparkSession.builder.master(cfg.master).appName(cfg.app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        try:
            session: SparkSession = builder.getOrCreate()
        except Exception as exc:
            raise SparkUnavailable(f"Spark session (master {cfg.master}) did not start: {exc}") from exc
        session.sparkContext.setLogLevel("ERROR")
        gctune.freeze_loaded()
        return session

    def _forget(self, session: SparkSession) -> None:
        """Drop a session, dead or alive, so that the next start makes a new JVM if needed."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        dead = not _alive(session)
        with contextlib.suppress(Exception):
            session.stop()
        if dead:
            # PySpark caches the gateway to the JVM in class attributes; a dead one must go.
            gateway = SparkContext._gateway
            with contextlib.suppress(Exception):
                if gateway is not None:
                    gateway.shutdown()
            SparkContext._gateway = None
            SparkContext._jvm = None
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None


def _quiet_python_side() -> None:
    """Keep py4j's and pyspark's own logging out of deltaforge's JSON log.

    They print Java stack traces for errors we report ourselves (with the
    processor's path); py4j even logs through the root logger, hence the filter.
    """
    for name in ("py4j", "pyspark", "SQLQueryContextLogger"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    root = logging.getLogger()
    if not any(isinstance(f, _NotPy4J) for f in root.filters):
        root.addFilter(_NotPy4J())


class _NotPy4J(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "py4j" not in record.pathname


def _alive(session: SparkSession) -> bool:
    try:
        return not session.sparkContext._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - a dead gateway fails in many ways; all mean "not alive"
        return False


_runtime: SparkRuntime | None = None
_runtime_lock = threading.Lock()


def runtime_for(config: SparkConfig, pipeline: str) -> SparkRuntime:
    """The process's runtime for ``config``; one Spark session per process.

    A second pipeline with processors shares the running session when its
    ``spec.spark`` matches, and is refused while the session is in use otherwise.
    """
    global _runtime
    with _runtime_lock:
        current = _runtime
        if current is not None and _same(current.config, config):
            return current
        if current is not None and current.users > 0:
            raise SparkUnavailable(
                f"spec.spark: pipeline {pipeline!r} asks for master {config.master!r} but this process "
                f"already runs Spark with master {current.config.master!r}; one Spark session per process"
            )
        if current is not None:
            current.stop()
            current.pool.shutdown(wait=False)
        _runtime = SparkRuntime(config)
        return _runtime


def _same(a: SparkConfig, b: SparkConfig) -> bool:
    # max_job_events is per pipeline; everything else shapes the shared session
    return (a.master, a.conf, a.threads, a.app_name) == (b.master, b.conf, b.threads, b.app_name)
