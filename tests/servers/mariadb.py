"""A private MariaDB with the binlog settings CDC needs (see shared ENVIRONMENT.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql

from tests.serve_proc import free_port

CDC_USER = "cdc"
CDC_PASSWORD = "cdc-secret-pw"


class MariaDB:
    """Starts ``mariadbd`` on a free port in a temporary directory.

    ``extra_args`` override server options (e.g. ``--binlog-format=STATEMENT``).
    """

    def __init__(self, extra_args: list[str] | None = None, server_id: int = 1) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="df-mariadb-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.server_id = server_id
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MariaDB:
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        args = [
            "mariadbd",
            "--no-defaults",
            f"--datadir={self.data}",
            "--user=root",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.dir}/mysql.sock",
            f"--pid-file={self.dir}/pid",
            f"--log-error={self.dir}/err.log",
            "--log-bin=mysql-bin",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",
            f"--server-id={self.server_id}",
            "--gtid-strict-mode=1",
            "--gtid-domain-id=0",
            "--innodb-flush-log-at-trx-commit=2",
            "--skip-name-resolve",
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.root().close()
                break
            except pymysql.err.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "err.log").read_text() if (self.dir / "err.log").exists() else ""
                    raise RuntimeError(f"mariadbd did not start: {log[-2000:]}") from None
                time.sleep(0.1)
        with self.root() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE USER IF NOT EXISTS '{CDC_USER}'@'%' IDENTIFIED BY '{CDC_PASSWORD}'")
            cur.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO '{CDC_USER}'@'%'")
        return self

    def root(self, db: str | None = None, **kw: Any) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", password="", database=db, autocommit=True, **kw
        )

    def dsn(self, db: str = "", user: str = CDC_USER, password: str = CDC_PASSWORD) -> str:
        return f"mysql://{user}:{password}@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> MariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
