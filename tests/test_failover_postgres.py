"""PostgreSQL failover through ``serve`` (issue 15, acceptance 5): a physical standby is promoted
and the chaos proxy's upstream moves to it (the DSN never changes). The FailoverReconciler sees
a new timeline, checks the checkpoint is reachable, and streaming continues from the new slot —
or halts with ``position lost`` when the new primary changed captured tables before its slot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from chaos.harness import ProxyServer, port_of
from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.postgres import Postgres, Standby


def _sql(dsn: str, *statements: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        result = None
        for statement in statements:
            cur = conn.execute(statement.encode())
            result = cur.fetchone() if cur.description else None
        return result


def _insert(dsn: str, ids: range) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in ids:
            conn.execute("INSERT INTO items VALUES (%s, 'x')", (i,))


def _ids(tmp: Path) -> list[int]:
    return [int(d["after"]["id"]) for d in jsonl(tmp / "events.jsonl") if d["op"] == "c"] if (
        tmp / "events.jsonl").exists() else []  # fmt: skip


def _start(tmp: Path, dsn: str) -> Serve:
    return serve_pipeline(tmp, {
        "source": {"type": "postgres", "config": {"id": "pg", "dsn": dsn, "slot": "s", "publication": "p",
                                                  "heartbeat_ms": 200}},
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
        "batch": {"max_events": 20, "max_ms": 20},
        "supervision": {"backoff": {"base_ms": 100, "max_ms": 1000}},
        "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
    })  # fmt: skip


def _fail_over(a: Postgres, b: Standby) -> None:
    """Let B replay everything A wrote, stop A, promote B (a new timeline)."""
    target = _sql(a.dsn(), "SELECT pg_current_wal_lsn()::text")[0]

    def replayed() -> bool:
        return bool(_sql(b.dsn(), f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")[0])

    wait_until_sync(replayed, timeout=30, what="the standby replayed the primary's WAL")
    a.halt()
    b.promote()
    _sql(b.dsn(), "CHECKPOINT")  # the new timeline shows in pg_control at once


def _checkpointed(serve: Serve, at_least: str) -> bool:
    cp = serve.get("/pipelines/shop/checkpoints").json()["f"]
    return cp is not None and bool(cp["position"]["lsn"] >= _lsn(at_least))


def _lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _switch(proxies: ProxyServer, b: Postgres) -> None:
    url = f"http://{proxies.host}:{proxies.port}/proxies/pg"
    assert httpx.patch(url, json={"upstream": f"127.0.0.1:{b.port}"}).status_code == 200


def _setup(a: Postgres, b: Standby, proxies: ProxyServer, tmp: Path) -> Serve:
    proxy = proxies.proxy("pg", f"127.0.0.1:{a.port}")
    serve = _start(tmp, f"postgresql://postgres@127.0.0.1:{port_of(proxy)}/postgres")
    try:
        _insert(a.dsn(), range(1, 51))
        wait_until_sync(lambda: len(_ids(tmp)) == 50, timeout=60, what="rows from the first primary")
        written = _sql(a.dsn(), "SELECT pg_current_wal_lsn()::text")[0]
        wait_until_sync(lambda: _checkpointed(serve, written), timeout=30, what="a checkpoint past A's rows")
    except BaseException:
        serve.kill()
        raise
    return serve


@pytest.fixture()
def pair() -> Iterator[tuple[Postgres, Standby]]:
    """A primary with the captured table, and its physical standby."""
    with Postgres() as a:
        _sql(a.dsn(), "CREATE TABLE items (id int PRIMARY KEY, v text)")
        with Standby(a) as b:
            yield a, b


def test_a_promoted_standby_with_a_new_slot_continues_from_the_slot(
    tmp_path: Path, proxies: ProxyServer, pair: tuple[Postgres, Standby]
) -> None:
    a, b = pair
    with _setup(a, b, proxies, tmp_path) as serve:
        _fail_over(a, b)
        _sql(b.dsn(), "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        _insert(b.dsn(), range(51, 101))  # after the slot: it decodes them
        _switch(proxies, b)
        wait_until_sync(lambda: sorted(set(_ids(tmp_path))) == list(range(1, 101)), timeout=60,
                        what="the new primary's rows")  # fmt: skip
        identity = serve.get("/pipelines/shop/identity").json()["identity"]
        assert identity["timeline"] == "2"
        [record] = serve.get("/pipelines/shop/reconcile").json()
        assert record["kind"] == "failover" and record["result"] == "reachable"
        assert record["previous"]["timeline"] == "1" and record["now"]["timeline"] == "2"
        assert serve.terminate() == 0
    events = [d["event"] for d in jsonl(tmp_path / "log.jsonl")]
    assert "failover_detected" in events and "position_adjusted" in events
    assert "position_unreachable" not in events
    assert _ids(tmp_path) == list(range(1, 101))  # each once, in commit order


def test_changes_on_the_new_primary_before_its_slot_halt_as_position_lost(
    tmp_path: Path, proxies: ProxyServer, pair: tuple[Postgres, Standby]
) -> None:
    a, b = pair
    with _setup(a, b, proxies, tmp_path) as serve:
        _fail_over(a, b)
        _insert(b.dsn(), range(51, 61))  # committed before the slot exists: it cannot decode them
        _sql(b.dsn(), "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        _insert(b.dsn(), range(61, 71))
        _switch(proxies, b)
        wait_until_sync(lambda: serve.get("/health").status_code == 503, timeout=60, what="/health 503")
        reasons = " ".join(serve.get("/health").json()["reasons"])
        assert "position lost: captured tables changed between the checkpoint" in reasons
        assert "Re-snapshot required." in reasons
        # The old primary's identity stays (nothing was accepted from the new one); the record says why.
        assert serve.get("/pipelines/shop/identity").json()["identity"]["timeline"] == "1"
        [record] = serve.get("/pipelines/shop/reconcile").json()
        assert record["result"] == "position_lost" and "captured tables changed" in record["reason"]
    assert _ids(tmp_path) == list(range(1, 51))  # nothing from the new primary


def test_a_standby_that_lagged_behind_the_checkpoint_halts_as_position_lost(
    tmp_path: Path, proxies: ProxyServer, pair: tuple[Postgres, Standby]
) -> None:
    a, b = pair
    with _setup(a, b, proxies, tmp_path) as serve:
        b.halt()  # the standby is down while A commits its last rows: it never gets them
        _insert(a.dsn(), range(51, 61))
        written = _sql(a.dsn(), "SELECT pg_current_wal_lsn()::text")[0]
        wait_until_sync(lambda: _checkpointed(serve, written), timeout=30, what="A's last rows checkpointed")
        a.halt()
        b.resume()
        b.promote()  # with what it had: a history that leaves A's before the checkpoint
        _sql(b.dsn(), "CHECKPOINT")
        _sql(b.dsn(), "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        _switch(proxies, b)
        wait_until_sync(lambda: serve.get("/health").status_code == 503, timeout=60, what="/health 503")
        reasons = " ".join(serve.get("/health").json()["reasons"])
        assert "it lacks changes the old primary committed" in reasons, reasons
        [record] = serve.get("/pipelines/shop/reconcile").json()
        assert record["kind"] == "failover" and record["result"] == "position_lost"
    assert _ids(tmp_path) == list(range(1, 61))  # all of the old primary's, nothing from the new one


def test_a_standby_whose_port_was_taken_meanwhile_starts_on_another() -> None:
    """The harness: a standby's port is picked before its base backup, and another worker's
    server may bind it meanwhile (a CI run's setup failed so once, with no log to tell). It
    starts on another free port instead, and streams from its primary there."""
    import socket

    with Postgres() as a:
        _sql(a.dsn(), "CREATE TABLE items (id int PRIMARY KEY, v text)")
        standby = Standby(a)
        taken = standby.port
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", taken))
            squatter.listen()
            with standby as b:
                assert b.port != taken
                _insert(a.dsn(), range(3))
                wait_until_sync(lambda: _sql(b.dsn(), "SELECT count(*) FROM items")[0] == 3,
                                timeout=30, what="the standby replaying the primary")  # fmt: skip
