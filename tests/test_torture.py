"""The seeded torture run per source (see tests/torture.py): random transactions, random SIGKILLs
of serve, and the file sink replays to the source's final state with every row's versions in order."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from tests import torture
from tests.mysql_kit import fresh_db as fresh_mysql_db
from tests.postgres_kit import fresh_db
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu
from tests.test_kafka_sink import consume

COLUMNS_A = ("id", "txt", "num", "bin", "ts", "ver")


def pg_target(postgres: Postgres, num: str = "numeric(12,4)", ts: str = "timestamptz") -> tuple[
    dict[str, Any], Any
]:  # fmt: skip
    """A PostgreSQL if_newer sink into a fresh database, and a function reading what it holds."""
    db = asyncio.run(fresh_db(postgres))
    dsn = postgres.dsn(db)

    async def setup() -> None:
        conn = await asyncpg.connect(dsn)
        await conn.execute(f"CREATE TABLE a (id int PRIMARY KEY, txt text, num {num}, bin bytea, ts {ts}, "
                           "ver int, _df_position text)")  # fmt: skip
        await conn.execute("CREATE TABLE b (k int PRIMARY KEY, v text, _df_position text)")
        await conn.close()

    asyncio.run(setup())

    def state() -> dict[str, dict[Any, dict[str, Any]]]:
        async def go() -> dict[str, dict[Any, dict[str, Any]]]:
            conn = await asyncpg.connect(dsn)
            a = {r["id"]: dict(r) for r in await conn.fetch("SELECT id, txt, num, bin, ts, ver FROM a")}
            b = {r["k"]: dict(r) for r in await conn.fetch("SELECT k, v FROM b")}
            await conn.close()
            return {"a": a, "b": b}

        return asyncio.run(go())

    entry = {"type": "postgres", "config": {"id": "pg", "dsn": dsn, "upsert_strategy": "if_newer"}}
    return entry, state


def broker_logs(redis: Redis, tansu: Tansu) -> dict[str, tuple[dict[str, Any], Any]]:
    """Redis Streams (exactly once: each change held once) and Kafka (one partition, so the topic
    is one ordered log) sinks, each with a function returning the events it holds, in order."""
    tansu.create_topic("torture", partitions=1)
    streams = ["torture.a", "torture.b"]

    def redis_events() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for stream in streams:
            fields = [f for _, f in redis.client().xrange(stream)]
            keys = [f[b"idempotency_key"] for f in fields]
            twice = sorted({k for k in keys if keys.count(k) > 1})[:5]
            assert not twice, f"redis exactly_once holds changes more than once: {twice}"
            out.extend(orjson.loads(f[b"event"]) for f in fields)  # one table per stream: order holds
        return out

    def kafka_events() -> list[dict[str, Any]]:
        return [doc for _, _, doc, _ in consume(tansu.bootstrap, "torture", 1, committed_only=False)]

    return {
        "redis": ({"type": "redis", "config": {"id": "rd", "uri": redis.uri(), "exactly_once": True,
                                                "stream": "torture.${source.table}"}}, redis_events),
        "kafka": ({"type": "kafka", "config": {"id": "kf", "brokers": tansu.bootstrap, "topic": "torture"}},
                  kafka_events),
    }  # fmt: skip


def _sql_ops(tx: list[torture.Op], mark: str) -> list[tuple[str, tuple[Any, ...]]]:
    """The transaction as SQL with ``mark`` placeholders (``$`` numbered, ``%s`` or ``?``)."""

    def ph(n: int) -> str:
        return f"${n}" if mark == "$" else mark

    out = []
    for op in tx:
        kind, table = op[0], op[1]
        key = "id" if table == "a" else "k"
        if kind in ("insert", "update"):
            row = op[2] if kind == "insert" else op[3]
            cols = list(row)
            if kind == "insert":
                marks = ", ".join(ph(i) for i in range(1, len(cols) + 1))
                out.append((f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", tuple(row.values())))
            else:
                sets = [c for c in cols if c != key]
                assigns = ", ".join(f"{c} = {ph(i)}" for i, c in enumerate(sets, 1))
                out.append((f"UPDATE {table} SET {assigns} WHERE {key} = {ph(len(sets) + 1)}",
                            (*(row[c] for c in sets), op[2])))  # fmt: skip
        elif kind == "rekey":
            out.append((f"UPDATE {table} SET {key} = {ph(1)} WHERE {key} = {ph(2)}", (op[3], op[2])))
        else:
            out.append((f"DELETE FROM {table} WHERE {key} = {ph(1)}", (op[2],)))
    return out


@pytest.mark.slow
def test_postgres_torture(tmp_path: Path, postgres: Postgres, redis_server: Redis, tansu: Tansu) -> None:
    db = asyncio.run(fresh_db(postgres))
    dsn = postgres.dsn(db)

    async def setup() -> None:
        conn = await asyncpg.connect(dsn)
        await conn.execute("CREATE TABLE a (id int PRIMARY KEY, txt text, num numeric(12,4), bin bytea, "
                           "ts timestamptz, ver int)")  # fmt: skip
        await conn.execute("CREATE TABLE b (k int PRIMARY KEY, v text)")
        await conn.execute("ALTER TABLE a REPLICA IDENTITY FULL")
        await conn.close()

    asyncio.run(setup())

    def write(tx: list[torture.Op]) -> None:
        async def go() -> None:
            conn = await asyncpg.connect(dsn)
            async with conn.transaction():
                for sql, args in _sql_ops(tx, "$"):
                    await conn.execute(sql, *args)
            await conn.close()

        asyncio.run(go())

    def final() -> dict[str, dict[Any, dict[str, Any]]]:
        async def go() -> dict[str, dict[Any, dict[str, Any]]]:
            conn = await asyncpg.connect(dsn)
            a = {r["id"]: dict(r) for r in await conn.fetch("SELECT * FROM a")}
            b = {r["k"]: dict(r) for r in await conn.fetch("SELECT * FROM b")}
            await conn.close()
            return {"a": a, "b": b}

        return asyncio.run(go())

    source = {"type": "postgres", "config": {"id": "pg", "dsn": "${PG_DSN}", "slot": f"t_{db}",
                                             "publication": f"t_{db}", "poll_interval_ms": 20}}  # fmt: skip
    torture.run(tmp_path, source, {"PG_DSN": dsn}, write, final, sinks={"postgres": pg_target(postgres)},
                logs=broker_logs(redis_server, tansu))  # fmt: skip


@pytest.mark.slow
def test_mariadb_torture(
    tmp_path: Path, mariadb: MariaDB, postgres: Postgres, redis_server: Redis, tansu: Tansu
) -> None:
    db = fresh_mysql_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.a (id INT PRIMARY KEY, txt VARCHAR(50), num DECIMAL(12,4), "
                    "bin VARBINARY(20), ts TIMESTAMP(6) NULL, ver INT) CHARACTER SET utf8mb4")  # fmt: skip
        cur.execute(f"CREATE TABLE {db}.b (k INT PRIMARY KEY, v VARCHAR(50)) CHARACTER SET utf8mb4")

    def write(tx: list[torture.Op]) -> None:
        with mariadb.root(db, charset="utf8mb4") as c, c.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            c.begin()
            for sql, args in _sql_ops(tx, "%s"):
                cur.execute(
                    sql, tuple(a.replace(tzinfo=None) if isinstance(a, dt.datetime) else a for a in args)
                )
            c.commit()

    def final() -> dict[str, dict[Any, dict[str, Any]]]:
        with mariadb.root(db, charset="utf8mb4") as c, c.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("SELECT id, txt, num, bin, ts, ver FROM a")
            a = {r[0]: dict(zip(COLUMNS_A, r, strict=True)) for r in cur.fetchall()}
            for row in a.values():  # TIMESTAMP is an instant: deltaforge gives it in UTC, with its zone
                row["ts"] = row["ts"].replace(tzinfo=dt.UTC) if row["ts"] else None
            cur.execute("SELECT k, v FROM b")
            b = {r[0]: {"k": r[0], "v": r[1]} for r in cur.fetchall()}
        return {"a": a, "b": b}

    source = {"type": "mysql", "config": {"id": "my", "dsn": "${MY_DSN}", "tables": [f"{db}.a", f"{db}.b"]}}
    torture.run(tmp_path, source, {"MY_DSN": mariadb.dsn()}, write, final, sinks={"postgres": pg_target(postgres)},
                logs=broker_logs(redis_server, tansu))  # fmt: skip


TURSO_WRITE = """
import sys, turso, orjson, datetime as dt
from decimal import Decimal
conn = turso.connect(sys.argv[1])
conn.execute("PRAGMA unstable_capture_data_changes_conn('full')")
for tx in orjson.loads(sys.stdin.buffer.read()):
    for sql, args in tx:
        conn.execute(sql, tuple(bytes.fromhex(a[4:]) if isinstance(a, str) and a.startswith("hex:") else a
                                for a in args))
    conn.commit()
conn.close()
"""
TURSO_READ = """
import sys, turso, orjson
conn = turso.connect(sys.argv[1])
a = conn.execute("SELECT id, txt, num, bin, ts, ver FROM a").fetchall()
b = conn.execute("SELECT k, v FROM b").fetchall()
sys.stdout.buffer.write(orjson.dumps({"a": [[*r[:3], r[3].hex() if r[3] is not None else None, *r[4:]] for r in a],
                                      "b": [list(r) for r in b]}))
"""


@pytest.mark.slow
def test_turso_torture(tmp_path: Path, postgres: Postgres, redis_server: Redis, tansu: Tansu) -> None:
    """Turso locks its file per process: transactions are written between serve's runs."""
    path = tmp_path / "app.db"

    def plain(v: Any) -> Any:  # what SQLite stores: decimals as REAL, times as ISO text, bytes as BLOB
        if isinstance(v, bytes):
            return "hex:" + v.hex()
        if isinstance(v, dt.datetime):
            return v.isoformat()
        return float(v) if isinstance(v, torture.Decimal) else v

    def write(tx: list[torture.Op]) -> None:
        ops = [[sql, [plain(a) for a in args]] for sql, args in _sql_ops(tx, "?")]
        subprocess.run([sys.executable, "-c", TURSO_WRITE, str(path)], input=orjson.dumps([ops]), check=True,
                       timeout=60)  # fmt: skip

    subprocess.run([sys.executable, "-c", TURSO_WRITE, str(path)], check=True, timeout=60, input=orjson.dumps([[
        ["CREATE TABLE a (id INTEGER PRIMARY KEY, txt TEXT, num REAL, bin BLOB, ts TEXT, ver INTEGER)", []],
        ["CREATE TABLE b (k INTEGER PRIMARY KEY, v TEXT)", []],
    ]]))  # fmt: skip

    def final() -> dict[str, dict[Any, dict[str, Any]]]:
        out = subprocess.run([sys.executable, "-c", TURSO_READ, str(path)], capture_output=True, check=True)
        doc = orjson.loads(out.stdout)
        a = {r[0]: dict(zip(COLUMNS_A, [*r[:3], bytes.fromhex(r[3]) if r[3] is not None else None, *r[4:]],
                             strict=True)) for r in doc["a"]}  # fmt: skip
        return {"a": a, "b": {r[0]: {"k": r[0], "v": r[1]} for r in doc["b"]}}

    source = {"type": "turso", "config": {"id": "db", "path": str(path), "poll_interval_ms": 20}}
    target = pg_target(postgres, num="float8", ts="text")
    torture.run(tmp_path, source, {}, write, final, concurrent=False, sinks={"postgres": target},
                logs=broker_logs(redis_server, tansu))  # fmt: skip
