"""A private PostgreSQL 15 cluster with wal_level=logical (see shared ENVIRONMENT.md)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from tests.serve_proc import free_port
from tests.servers.base import ServerProcess
from tests.servers.netns import Link


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"{name} not found: install postgresql-15")
    return found[-1]


class Postgres(ServerProcess):
    """initdb as user postgres in a temp dir, started with pg_ctl, stopped by pg_ctl (or its PID)."""

    name = "pg"

    def __init__(self, link: Link | None = None) -> None:
        """``link``: the server runs in that link's namespace, listening on its far address
        (:meth:`dsn`), and on its unix socket, which no cut of the link reaches
        (:meth:`local_dsn`)."""
        super().__init__()
        self.data = self.dir / "data"
        self.host = link.there if link is not None else "127.0.0.1"
        self._prefix = link.run_in() if link is not None else []

    def _as_postgres(self, *cmd: str) -> None:
        # In the server's own directory: pg_ctl changes back to its starting directory after
        # resolving its path, and a CI clone (mktemp -d, mode 700, root's) is not the postgres
        # user's to enter: "could not change directory ... Permission denied" (seen once in CI).
        done = subprocess.run(
            [*self._prefix, "su", "postgres", "-c", " ".join(cmd)],
            capture_output=True,
            timeout=120,
            cwd=self.dir,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{cmd[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')[-1000:]}"
            )

    def start(self) -> Postgres:
        shutil.chown(self.dir, "postgres")
        os.chmod(self.dir, 0o700)
        self._as_postgres(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as f:
            # A worker's server serves every PostgreSQL test it runs, and most leave their slot behind
            # (a test database each): 40 ran out on 4 Dec, once a worker happened to run more of them.
            f.write(
                f"port = {self.port}\nlisten_addresses = '{self.host}'\nunix_socket_directories = '{self.dir}'\n"
                "wal_level = logical\nmax_replication_slots = 200\nmax_wal_senders = 40\nfsync = off\n"
                "synchronous_commit = on\nfull_page_writes = off\n"
            )
        if self._prefix:  # reached over the link, from this host's side of it
            with open(self.data / "pg_hba.conf", "a") as f:
                f.write("host all all 10.0.0.0/8 trust\nhost replication all 10.0.0.0/8 trust\n")
        self._start_on_a_free_port()
        return self

    def _start_on_a_free_port(self) -> None:
        """``pg_ctl start``, on another free port if this one was taken between picking it and
        the server binding it (by another worker's server); any other failure with the server's
        log, which goes with its temp dir."""
        for _ in range(3):
            try:
                self._as_postgres(
                    _bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start"
                )
                return
            except RuntimeError as exc:
                log = self.dir / "log"
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                if "Address already in use" not in tail:
                    raise RuntimeError(f"{exc}\nserver log: {tail}") from None
                self.port = free_port()
                with open(self.data / "postgresql.conf", "a") as f:  # the last setting wins
                    f.write(f"port = {self.port}\n")
        raise RuntimeError(f"pg did not start: its port was taken three times ({self.dir / 'log'})")

    def halt(self) -> None:
        """Stop the server (fast shutdown), keeping its data: an outage."""
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start it again after :meth:`halt`, on the same port."""
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")

    def set_next_oid(self, oid: int) -> None:
        """Stop the server, set the oid its next object takes (``pg_resetwal -o``), start it again:
        a cluster that has made that many objects (temporary tables, types, large objects)."""
        self.halt()
        self._as_postgres(_bin("pg_resetwal"), "-o", str(oid), "-D", str(self.data))
        self.resume()

    def copy_files(self) -> Path:
        """A copy of the files of the server, stopped by :meth:`halt` (what a disk snapshot holds)."""
        copy = self.dir / "copy"
        subprocess.run(["cp", "-a", str(self.data), str(copy)], check=True, timeout=120)  # keeps the owner
        return copy

    def restore_files(self, copy: Path) -> None:
        """Put the server's files back as :meth:`copy_files` took them (stopped by :meth:`halt`)."""
        shutil.rmtree(self.data)
        copy.rename(self.data)

    def dsn(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{db}"

    def local_dsn(self, db: str = "postgres") -> str:
        """Over the server's unix socket (no network between)."""
        return f"postgresql://postgres@/{db}?host={self.dir}&port={self.port}"

    def server_pid(self) -> int | None:
        """The postmaster's pid (pg_ctl starts it: it is not this process's child), or None when
        the server is not running."""
        pid_file = self.data / "postmaster.pid"
        return int(pid_file.read_text().split()[0]) if pid_file.exists() else None

    def stop(self) -> None:
        try:
            self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        except RuntimeError:
            if (pid := self.server_pid()) is not None:
                os.kill(pid, 9)
        shutil.rmtree(self.dir, ignore_errors=True)


class Standby(Postgres):
    """A physical standby of ``primary`` (pg_basebackup -R, streaming replication) on its own port."""

    def __init__(self, primary: Postgres) -> None:
        super().__init__()
        self.primary = primary

    def start(self) -> Standby:
        shutil.chown(self.dir, "postgres")
        os.chmod(self.dir, 0o700)
        self._as_postgres(_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                          "-D", str(self.data), "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"port = {self.port}\nunix_socket_directories = '{self.dir}'\n")
        # Its port was picked before the base backup: the longer window of the two for a race.
        self._start_on_a_free_port()
        return self

    def promote(self) -> None:
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-w", "promote")
