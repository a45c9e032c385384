"""Unavailable is not crashed: a source database stopped mid-stream is waited for while
``/health`` says ``degraded`` (and ``/ready`` 503), and when it is back the pipeline
recovers by itself and every change reaches the sink. Through ``serve``, real servers.

``DF_OUTAGE_S`` (default 60) sets how long each server stays down.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import Serve
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres

OUTAGE_S = float(os.environ.get("DF_OUTAGE_S", "60"))


def pipeline(tmp: Path, source: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "shop"},
        "spec": {
            "source": source,
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
            "batch": {"max_events": 100, "max_ms": 20},
            # The defaults: an outage must not need a lenient restart policy.
            "supervision": {
                "max_restarts": 5,
                "within_seconds": 60,
                "backoff": {"base_ms": 100, "max_ms": 2000},
            },
            "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
        },
    }
    path = tmp / "shop.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def delivered_ids(tmp: Path) -> list[int]:
    return [int(d["after"]["id"]) for d in jsonl(tmp / "events.jsonl") if d["op"] == "c"]


def ride_through(
    tmp: Path, cfg: Path, env: dict[str, str], write: Callable[[range], None], halt: Callable[[], None],
    resume: Callable[[], None],
) -> None:  # fmt: skip
    """Write, stop the server for OUTAGE_S while serve runs, start it, write more: all arrive."""
    with Serve(tmp, "--config", str(cfg), "--log-file", str(tmp / "log.jsonl"), env=env) as serve:
        serve.wait_api()
        serve.wait_source_open("shop")  # no snapshot yet: rows written before that are not captured
        write(range(1, 201))
        wait_until_sync(lambda: len(delivered_ids(tmp)) >= 200, timeout=60, what="first rows delivered")
        halt()
        down_at = time.monotonic()

        def degraded() -> bool:
            body = serve.get("/health").json()
            return body["status"] == "degraded" and "source" in body["unavailable"].get("shop", {})

        wait_until_sync(degraded, timeout=30, what="/health degraded")
        health = serve.get("/health")
        assert health.status_code == 200
        outage = health.json()["unavailable"]["shop"]["source"]
        assert outage["last_error"] and outage["since"]
        assert serve.get("/ready").status_code == 503
        # The outage itself: the server stays down this long, whatever the pipeline does.
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert serve.get("/health").json()["status"] == "degraded"
        assert serve.get("/pipelines/shop").json()["state"] == "running"
        resume()
        write(range(201, 401))
        wait_until_sync(lambda: len(set(delivered_ids(tmp))) >= 400, timeout=120, what="all rows delivered")
        wait_until_sync(lambda: serve.get("/ready").status_code == 200, timeout=30, what="/ready 200")
        assert serve.get("/health").json() == {"status": "ok", "pipelines": {"shop": "running"}}
        assert serve.terminate() == 0
    ids = delivered_ids(tmp)
    assert sorted(set(ids)) == list(range(1, 401))  # nothing lost
    assert [i for n, i in enumerate(ids) if i not in ids[:n]] == list(range(1, 401))  # in commit order
    events = [r["event"] for r in jsonl(tmp / "log.jsonl")]
    assert "child_unavailable" in events and "available_again" in events
    assert "supervisor_escalated" not in events and "pipeline_failed" not in events


@pytest.mark.outage_minute
def test_postgres_stopped_mid_stream_is_waited_for_and_nothing_is_lost(tmp_path: Path) -> None:
    with Postgres() as pg:

        async def sql(statement: str, *args: Any) -> None:
            conn = await asyncpg.connect(pg.dsn())
            await conn.execute(statement, *args)
            await conn.close()

        asyncio.run(sql("CREATE TABLE items (id int PRIMARY KEY, payload text)"))
        source = {
            "type": "postgres",
            "config": {"id": "pg", "dsn": "${PG_DSN}", "slot": "outage", "publication": "outage",
                       "heartbeat_ms": 500, "poll_interval_ms": 20},
        }  # fmt: skip

        def write(ids: range) -> None:
            for i in ids:
                asyncio.run(sql("INSERT INTO items VALUES ($1, 'x')", i))

        ride_through(tmp_path, pipeline(tmp_path, source), {"PG_DSN": pg.dsn()}, write, pg.halt, pg.resume)


@pytest.mark.outage_minute
def test_mariadb_stopped_mid_stream_is_waited_for_and_nothing_is_lost(tmp_path: Path) -> None:
    with MariaDB() as db:
        with db.root() as c, c.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, payload VARCHAR(10))")
        source = {"type": "mysql", "config": {"id": "my", "dsn": "${MY_DSN}", "tables": ["shop.items"]}}

        def write(ids: range) -> None:
            with db.root() as c, c.cursor() as cur:
                for i in ids:
                    cur.execute("INSERT INTO shop.items VALUES (%s, 'x')", (i,))

        ride_through(tmp_path, pipeline(tmp_path, source), {"MY_DSN": db.dsn()}, write, db.halt, db.resume)
