"""PostgreSQL → file through ``python -m deltaforge serve``: SIGKILL resume and a dropped slot."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import asyncpg
import pytest
import yaml

from tests.helpers import first_occurrences, jsonl, stored_checkpoint, wait_until_sync
from tests.postgres_kit import fresh_db
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.postgres import Postgres


def pipeline_yaml(tmp: Path, pg: Postgres, db: str) -> Path:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "orders", "tenant": "acme"},
        "spec": {
            "source": {
                "type": "postgres",
                "config": {
                    "id": "orders-pg",
                    "dsn": "${PG_DSN}",
                    "slot": f"slot_{db}",
                    "publication": "df_pub",
                    "tables": ["public.items"],
                    "heartbeat_ms": 200,
                    "poll_interval_ms": 20,
                },
            },
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
            "batch": {"max_events": 100, "max_ms": 20},
            "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
        },
    }
    path = tmp / "orders.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


sink_lines = jsonl


def checkpoint_lsn(cp_db: Path) -> int:
    cp = stored_checkpoint(cp_db, "orders-pg::sink::f")
    return int(cp["lsn"]) if cp else 0


class Workload(threading.Thread):
    """Inserts rows and bumps their version in small transactions."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.done: list[tuple[int, int]] = []
        self.rng = random.Random(5)

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        versions: dict[int, int] = {}
        while not self.stop.is_set():
            if not versions or self.rng.random() < 0.4:
                rid = len(versions) + 1
                versions[rid] = 1
                await conn.execute("INSERT INTO items VALUES ($1, 1, repeat('p', 40))", rid)
            else:
                rid = self.rng.choice(list(versions))
                versions[rid] += 1
                await conn.execute("UPDATE items SET version = $1 WHERE id = $2", versions[rid], rid)
            self.done.append((rid, versions[rid]))
            await asyncio.sleep(0.002)
        await conn.close()


def slot_exists(pg: Postgres, db: str) -> bool:
    async def check() -> bool:
        conn = await asyncpg.connect(pg.dsn(db))
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f"slot_{db}"
        )
        await conn.close()
        return bool(found)

    return asyncio.run(check())


async def _prepare(pg: Postgres, db: str) -> None:
    conn = await asyncpg.connect(pg.dsn(db))
    await conn.execute("CREATE TABLE items (id int PRIMARY KEY, version int, payload text)")
    await conn.close()


@pytest.mark.slow
def test_sigkill_ten_times_loses_nothing_and_keeps_row_order(postgres: Postgres, tmp_path: Path) -> None:
    db = asyncio.run(fresh_db(postgres))
    asyncio.run(_prepare(postgres, db))
    cfg = pipeline_yaml(tmp_path, postgres, db)
    env = {"PG_DSN": postgres.dsn(db)}
    out = tmp_path / "events.jsonl"
    rng = random.Random(11)
    # The first start creates the slot; the workload begins after it exists.
    with Serve(tmp_path, "--config", str(cfg), api=False, env=env) as serve:
        wait_until_sync(lambda: slot_exists(postgres, db), timeout=30, what="slot created")
        serve.kill()
    work = Workload(postgres.dsn(db))
    work.start()
    try:
        for _ in range(10):
            before = len(sink_lines(out))
            with Serve(tmp_path, "--config", str(cfg), api=False, env=env) as serve:
                wait_until_sync(lambda: len(sink_lines(out)) > before, timeout=30, what="new deliveries")  # noqa: B023
                time.sleep(rng.uniform(0.0, 0.4))
                serve.kill()
    finally:
        work.stop.set()
        work.join(10)

    async def wal_now() -> int:
        conn = await asyncpg.connect(postgres.dsn(db))
        lsn = int(await conn.fetchval("SELECT pg_current_wal_lsn()"))
        await conn.close()
        return lsn

    target = asyncio.run(wal_now())
    with Serve(tmp_path, "--config", str(cfg), api=False, env=env) as serve:
        wait_until_sync(lambda: checkpoint_lsn(tmp_path / "cp.db") >= target, timeout=60, what="caught up")
        assert serve.terminate() == 0
    got = [(int(d["after"]["id"]), int(d["after"]["version"])) for d in sink_lines(out)]
    assert len(work.done) > 300
    assert set(work.done) <= set(got), f"missing {sorted(set(work.done) - set(got))[:10]}"
    assert first_occurrences(got) == work.done


@pytest.mark.parametrize("while_stopped", ["slot dropped", "table out of the publication and back"])
def test_what_was_lost_while_stopped_halts_serve_with_503(
    postgres: Postgres, tmp_path: Path, while_stopped: str
) -> None:
    """What happened while serve was stopped lost changes for good: the slot dropped, or the
    table taken out of the publication (an insert made then was never published) and put back.
    The next start halts saying so, /health 503; before, the second went on without a word."""
    db = asyncio.run(fresh_db(postgres))
    asyncio.run(_prepare(postgres, db))
    cfg = pipeline_yaml(tmp_path, postgres, db)
    env = {"PG_DSN": postgres.dsn(db)}
    statements = {
        "slot dropped": [f"SELECT pg_drop_replication_slot('slot_{db}')"],
        "table out of the publication and back": [
            "ALTER PUBLICATION df_pub DROP TABLE items",
            "INSERT INTO items VALUES (2, 1, 'x')",
            "ALTER PUBLICATION df_pub ADD TABLE items",
        ],
    }[while_stopped]
    reason = {
        "slot dropped": f"replication slot 'slot_{db}' does not exist (dropped?)",
        "table out of the publication and back": "table public.items was taken out of publication "
        "'df_pub' and put back, or its row filter or column list was changed since the last run: what it "
        "left out was never published",
    }[while_stopped]

    async def run(sql: list[str]) -> None:
        conn = await asyncpg.connect(postgres.dsn(db))
        for statement in sql:
            await conn.execute(statement)
        await conn.close()

    with Serve(tmp_path, "--config", str(cfg), env=env) as serve:
        serve.wait_api()
        wait_until_sync(lambda: slot_exists(postgres, db), timeout=30, what="slot created")
        asyncio.run(run(["INSERT INTO items VALUES (1, 1, 'x')"]))
        wait_until_sync(lambda: len(sink_lines(tmp_path / "events.jsonl")) == 1, timeout=30, what="delivered")
        assert serve.terminate() == 0
    asyncio.run(run(statements))
    with Serve(tmp_path, "--config", str(cfg), env=env) as serve:
        serve.wait_api()
        wait_until_sync(lambda: serve.get("/health").status_code == 503, timeout=30, what="503")
        assert serve.get("/health").json()["reasons"] == [
            f"orders: position lost: {reason}. Re-snapshot required."
        ]
        assert serve.terminate() == 0


def test_a_transaction_too_large_to_hold_is_split_and_survives_a_sigkill_inside_it(
    postgres: Postgres, tmp_path: Path
) -> None:
    """A transaction over ``batch.max_tx_events`` is delivered in batches as it is read (logged
    ``transaction_split``) instead of held whole; a SIGKILL once part of it is checkpointed
    resumes inside it, and every row arrives in order."""
    db = asyncio.run(fresh_db(postgres))
    asyncio.run(_prepare(postgres, db))
    spec = yaml.safe_load(pipeline_yaml(tmp_path, postgres, db).read_text())["spec"]
    spec["source"]["config"].update(dsn=postgres.dsn(db), read_chunk=1000)
    spec["batch"] = {"max_events": 1000, "max_ms": 20, "max_tx_events": 4000}
    rows = 100_000

    async def write() -> int:
        conn = await asyncpg.connect(postgres.dsn(db))
        await conn.execute(f"INSERT INTO items SELECT g, 1, 'p' FROM generate_series(1, {rows}) g")
        await conn.execute("INSERT INTO items VALUES (0, 1, 'after')")
        lsn = int(await conn.fetchval("SELECT pg_current_wal_lsn()"))
        await conn.close()
        return lsn

    def inside() -> bool:
        cp = stored_checkpoint(tmp_path / "cp.db", "orders-pg::sink::f")
        return cp is not None and 0 < int(cp["seq"]) < rows - 1  # part of the big one, not its end

    with serve_pipeline(tmp_path, spec, name="orders") as serve:
        target = asyncio.run(write())
        wait_until_sync(inside, timeout=60, what="a checkpoint inside the transaction")
        serve.kill()
    with serve_pipeline(tmp_path, spec, name="orders") as serve:
        wait_until_sync(lambda: checkpoint_lsn(tmp_path / "cp.db") >= target, timeout=120, what="caught up")
        assert serve.terminate() == 0
    lines = sink_lines(tmp_path / "events.jsonl")
    got = first_occurrences([int(d["after"]["id"]) for d in lines])
    assert got == [*range(1, rows + 1), 0], f"{len(got)} of {rows + 1}"
    assert len(lines) < 2 * rows  # what the sink held before the kill was not written again
    assert '"transaction_split"' in (tmp_path / "log.jsonl").read_text()
