"""A private Spark standalone cluster (one master, one worker) from the pyspark installation.

pip's pyspark has no sbin start scripts, but ``bin/spark-class`` runs the
master and worker daemons directly (ENVIRONMENT.md). Both run in their own
process groups and are stopped by PID; their work and log dirs are temporary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pyspark

from tests.serve_proc import free_port
from tests.servers.base import claim, note_launched

SPARK_HOME = Path(pyspark.__file__).parent


class SparkCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="df-spark-"))
        claim(self.dir)  # a run killed leaves the daemons to the next one's forget_orphans
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _daemon(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOG_DIR": str(self.dir),
            "SPARK_WORKER_DIR": str(self.dir / "work"),
            # the REST submission server would take the fixed port 6066
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.procs.append(proc)
        note_launched(self.dir, proc.pid)
        return proc

    def start(self) -> SparkCluster:
        self._daemon(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", "0",
        )  # fmt: skip
        self._daemon(
            "worker", "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--webui-port", "0", "--cores", "1", "--memory", "1g", self.master_url,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        log = self.dir / "master.log"
        while "Registering worker" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"spark cluster did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        return self

    def applications(self) -> list[str]:
        """Application ids the master has seen (from its log)."""
        text = (self.dir / "master.log").read_text()
        return [ln.rsplit(" ", 1)[-1] for ln in text.splitlines() if "Registered app" in ln]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
