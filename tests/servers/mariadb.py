"""A private MariaDB with the binlog settings CDC needs (see shared ENVIRONMENT.md)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pymysql

from tests.servers.base import ServerProcess

CDC_USER = "cdc"
CDC_PASSWORD = "cdc-secret-pw"


class MariaDB(ServerProcess):
    """Starts ``mariadbd`` on a free port in a temporary directory.

    ``extra_args`` override server options (e.g. ``--binlog-format=STATEMENT``).
    """

    name = "mariadb"
    start_timeout = 60.0

    def __init__(self, extra_args: list[str] | None = None, server_id: int = 1) -> None:
        super().__init__()
        self.data = self.dir / "data"
        self.tmp = self.dir / "tmp"
        """Its own temporary directory: two bootstraps sharing /tmp collide on their temporary
        tables (``Unknown table 'mysql.tmp_user_sys'``; 2 in 10 concurrent pairs here)."""
        self.server_id = server_id
        self.extra_args = extra_args or []

    def command(self) -> list[str]:
        return [
            "mariadbd",
            "--no-defaults",
            f"--datadir={self.data}",
            "--user=root",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.dir}/mysql.sock",
            f"--pid-file={self.dir}/pid",
            f"--log-error={self.dir}/err.log",
            f"--tmpdir={self.tmp}",
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

    def ready(self) -> bool:
        try:
            self.root().close()
            return True
        except pymysql.err.OperationalError:
            return False

    def failure_detail(self) -> str:
        log = self.dir / "err.log"
        return f": {log.read_text()[-2000:]}" if log.exists() else ""

    def start(self) -> MariaDB:
        self.tmp.mkdir(exist_ok=True)
        done = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data}",
                f"--tmpdir={self.tmp}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({done.returncode}): {(done.stdout + done.stderr)[:2000]}"
            )
        super().start()
        with self.root() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE USER IF NOT EXISTS '{CDC_USER}'@'%' IDENTIFIED BY '{CDC_PASSWORD}'")
            cur.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO '{CDC_USER}'@'%'")
        return self

    def halt(self) -> None:
        """Shut the server down (SIGTERM), keeping its data: an outage."""
        self.kill(timeout=30)

    def resume(self) -> None:
        """Start it again after :meth:`halt`, on the same port and data."""
        ServerProcess.start(self)

    def root(self, db: str | None = None, **kw: Any) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", password="", database=db, autocommit=True, **kw
        )

    def dsn(self, db: str = "", user: str = CDC_USER, password: str = CDC_PASSWORD) -> str:
        return f"mysql://{user}:{password}@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self.kill(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def purge_all_but_newest(self, gone: str) -> None:
        """Purge binlogs until ``gone`` is no longer listed (a closing dump thread may still hold
        a file for a moment, so this retries)."""
        import time

        with self.root() as c, c.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            newest = cur.fetchone()[0]
            deadline = time.monotonic() + 15
            while True:
                cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
                cur.execute("SHOW BINARY LOGS")
                if gone not in {r[0] for r in cur.fetchall()}:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"{gone} was not purged")
                time.sleep(0.1)

    @contextlib.contextmanager
    def replica(self, log_updates: bool = True) -> Iterator[MariaDB]:
        """A GTID replica of this server that logs what it applies (so it can be promoted), or,
        with ``log_updates=False``, one that does not (a CDC reader of it would see nothing)."""
        args = ["--log-slave-updates"] if log_updates else []
        with MariaDB(extra_args=args, server_id=self.server_id + 1) as replica:
            with replica.root() as conn, conn.cursor() as cur:
                cur.execute("RESET MASTER")  # only this server's history from here on
                cur.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.port}, "
                            "MASTER_USER='root', MASTER_USE_GTID=slave_pos")  # fmt: skip
                cur.execute("START SLAVE")
            yield replica

    def promote(self) -> None:
        """This replica becomes a primary: replication stopped and forgotten."""
        with self.root() as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("RESET SLAVE ALL")

    def gtid_binlog_pos(self) -> str:
        with self.root() as conn, conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            return str(cur.fetchone()[0] or "")
