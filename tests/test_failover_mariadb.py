"""MariaDB failover and lost history through ``serve`` (issue 15, acceptance 2 and 4): the chaos
proxy stands in for the address that moves to the promoted replica. A replica that lagged behind
the checkpoint, and a server whose binlog history was wiped, halt with ``position lost``, /health
503, the ReconcileRecord visible over REST, and nothing delivered from that server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chaos.harness import ProxyServer, port_of
from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.mariadb import MariaDB


@pytest.fixture()
def proxies() -> Iterator[ProxyServer]:
    server = ProxyServer()
    yield server
    server.close()


@contextlib.contextmanager
def _replica_of(primary: MariaDB) -> Iterator[MariaDB]:
    """A GTID replica of ``primary`` that logs what it applies (so it can be promoted)."""
    with MariaDB(extra_args=["--log-slave-updates"], server_id=2) as replica:
        with replica.root() as conn, conn.cursor() as cur:
            cur.execute("RESET MASTER")  # only the primary's history from here on
            cur.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
                        "MASTER_USER='root', MASTER_USE_GTID=slave_pos")  # fmt: skip
            cur.execute("START SLAVE")
        yield replica


def _write(server: MariaDB, ids: range) -> None:
    with server.root("shop") as conn, conn.cursor() as cur:
        for i in ids:
            cur.execute("INSERT INTO items VALUES (%s, 'x')", (i,))


def _ids(tmp: Path) -> list[int]:
    path = tmp / "events.jsonl"
    return [int(d["after"]["id"]) for d in jsonl(path) if d["op"] == "c"] if path.exists() else []


def _serve(tmp: Path, port: int, server: MariaDB) -> Serve:
    dsn = server.dsn("shop").replace(f":{server.port}/", f":{port}/")
    return serve_pipeline(tmp, {
        "source": {"type": "mysql", "config": {"id": "my", "dsn": dsn, "tables": ["shop.items"]}},
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
        "batch": {"max_events": 20, "max_ms": 20},
        "supervision": {"backoff": {"base_ms": 100, "max_ms": 1000}},
        "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
    })  # fmt: skip


def _halted(serve: Serve, why: str) -> dict[str, object]:
    wait_until_sync(lambda: serve.get("/health").status_code == 503, timeout=60, what="/health 503")
    reasons = " ".join(serve.get("/health").json()["reasons"])
    assert "position lost:" in reasons and why in reasons and "Re-snapshot required." in reasons, reasons
    [record] = serve.get("/pipelines/shop/reconcile").json()
    assert record["result"] == "position_lost"
    return dict(record)


def test_a_replica_that_lagged_behind_the_checkpoint_halts_as_position_lost(
    tmp_path: Path, proxies: ProxyServer
) -> None:
    with MariaDB() as a:
        with a.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, v TEXT)")
        with _replica_of(a) as b:
            proxy = proxies.proxy("my", f"127.0.0.1:{a.port}")
            with _serve(tmp_path, port_of(proxy), a) as serve:
                _write(a, range(1, 21))
                wait_until_sync(lambda: len(_ids(tmp_path)) == 20, timeout=60, what="rows from the primary")
                with b.root() as conn, conn.cursor() as cur:
                    cur.execute("STOP SLAVE")  # the replica falls behind here
                _write(a, range(21, 31))
                wait_until_sync(lambda: len(_ids(tmp_path)) == 30, timeout=60, what="the primary's last rows")
                a.halt()
                with b.root() as conn, conn.cursor() as cur:
                    cur.execute("RESET SLAVE ALL")  # promoted
                _write(b, range(100, 105))
                url = f"http://{proxies.host}:{proxies.port}/proxies/my"
                assert httpx.patch(url, json={"upstream": f"127.0.0.1:{b.port}"}).status_code == 200
                record = _halted(serve, "is not in this server's binlog state")
                assert record["kind"] == "failover"
                assert serve.get("/pipelines/shop/identity").json()["identity"]["server_id"] == "1"
    assert _ids(tmp_path) == list(range(1, 31))  # nothing from the replica


def test_a_wiped_binlog_history_on_the_same_server_halts_as_position_lost(
    tmp_path: Path, proxies: ProxyServer
) -> None:
    with MariaDB() as a:
        with a.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, v TEXT)")
        proxy = proxies.proxy("my", f"127.0.0.1:{a.port}")
        with _serve(tmp_path, port_of(proxy), a) as serve:
            _write(a, range(1, 21))
            wait_until_sync(lambda: len(_ids(tmp_path)) == 20, timeout=60, what="rows delivered")
            assert serve.terminate() == 0
        with a.root() as conn, conn.cursor() as cur:
            cur.execute("RESET MASTER")
        _write(a, range(21, 26))
        serve = Serve(
            tmp_path, "--config", str(tmp_path / "shop.yaml"), "--log-file", str(tmp_path / "log.jsonl")
        )
        with serve:
            serve.wait_api()
            record = _halted(serve, "RESET MASTER")
            assert record["kind"] == "same_server"
    assert _ids(tmp_path) == list(range(1, 21))


def test_a_caught_up_replica_is_refused_for_now_with_why_never_resumed_at_a_wrong_offset(
    tmp_path: Path, proxies: ProxyServer
) -> None:
    """Binlog coordinates differ between servers, so resuming there could skip the new server's
    changes as already held: until positions carry a failover generation it halts, saying so."""
    with MariaDB() as a:
        with a.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, v TEXT)")
        with _replica_of(a) as b:
            proxy = proxies.proxy("my", f"127.0.0.1:{a.port}")
            with _serve(tmp_path, port_of(proxy), a) as serve:
                _write(a, range(1, 21))
                wait_until_sync(lambda: len(_ids(tmp_path)) == 20, timeout=60, what="rows from the primary")

                def replicated() -> bool:
                    with b.root() as conn, conn.cursor() as cur:
                        cur.execute("SELECT COUNT(*) FROM shop.items")
                        return bool(cur.fetchone()[0] == 20)

                wait_until_sync(replicated, timeout=30, what="the replica caught up")
                a.halt()
                with b.root() as conn, conn.cursor() as cur:
                    cur.execute("STOP SLAVE")
                    cur.execute("RESET SLAVE ALL")
                url = f"http://{proxies.host}:{proxies.port}/proxies/my"
                assert httpx.patch(url, json={"upstream": f"127.0.0.1:{b.port}"}).status_code == 200
                wait_until_sync(
                    lambda: serve.get("/health").status_code == 503, timeout=60, what="/health 503"
                )
                reasons = " ".join(serve.get("/health").json()["reasons"])
                assert "failover detected" in reasons and "Re-snapshot from the new server" in reasons
                [record] = serve.get("/pipelines/shop/reconcile").json()
                assert record["kind"] == "failover" and record["result"] == "refused"
    assert _ids(tmp_path) == list(range(1, 21))
