"""Session-wide fixtures: private servers started once, stopped by PID at the end."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.harness import ProxyServer
from deltaforge import logsetup
from deltaforge.logrepeats import LIBRARIES
from tests.servers import base, netns
from tests.servers.mariadb import MariaDB
from tests.servers.nats import Nats, NatsCluster
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu


def pytest_configure(config: pytest.Config) -> None:
    """Logs as ``serve`` writes them (JSON lines, plain tracebacks). structlog's default console
    renderer draws every traceback with rich, locals included: under a loaded CI machine one
    restart's line took seconds, and a test of restart intensity ran out of time (seen once).
    Network namespaces and servers left by a test run that was killed are removed
    (``netns.py``, ``servers/base.py``); once, not in each xdist worker."""
    logsetup.configure("info")
    if not hasattr(config, "workerinput"):
        netns.forget_orphans()
        base.forget_orphans()


@pytest.fixture(autouse=True)
def library_lines_unseen() -> None:
    """Each test starts with no library line seen: a line an earlier test of the same worker
    logged would otherwise be held back for a minute (``logrepeats``)."""
    LIBRARIES.forget()


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDB]:
    """A private MariaDB 10.11 with ROW binlog, FULL image and metadata, GTID strict mode."""
    with MariaDB() as server:  # a start that fails stops what it started and removes its files
        yield server


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A private PostgreSQL 15 cluster with wal_level=logical."""
    with Postgres() as server:  # a start that fails stops what it started and removes its files
        yield server


@pytest.fixture()
def redis_server() -> Iterator[Redis]:
    """A private redis-server per test (tests stop and restart it)."""
    with Redis() as server:  # a start that fails stops what it started and removes its files
        yield server


@pytest.fixture()
def nats_server() -> Iterator[Nats]:
    """A private nats-server with JetStream, per test."""
    with Nats() as server:  # a start that fails stops what it started and removes its files
        yield server


@pytest.fixture()
def nats_cluster() -> Iterator[NatsCluster]:
    """Three nats-servers with JetStream in one cluster, per test."""
    with NatsCluster() as cluster:
        yield cluster


@pytest.fixture
def tls_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.fixture()
def tansu() -> Iterator[Tansu]:
    """A private Tansu broker (Kafka protocol, memory storage), per test."""
    with Tansu() as server:  # a start that fails stops what it started and removes its files
        yield server


@pytest.fixture()
def proxies() -> Iterator[ProxyServer]:
    """A private Toxiproxy (or the chaos proxy speaking its API) per test."""
    server = ProxyServer()
    yield server
    server.close()
