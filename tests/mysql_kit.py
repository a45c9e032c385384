"""Helpers for the MySQL/MariaDB source's tests: a fresh database, a source, a pipeline to a file."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from deltaforge.config import parse_pipeline
from deltaforge.events import Event
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.source import MySQLSource
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.servers.mariadb import CDC_PASSWORD, CDC_USER, MariaDB

_db_counter = itertools.count(1)


def binlog_reader(
    server: MariaDB, file: str, pos: int, only_events: list[type], server_id: int = 4242
) -> Any:
    """python-mysql-replication's own reader of ``server``'s binlog from ``file:pos``, as the CDC
    user, checking each event's checksum; it stops at the binlog's end (not blocking)."""
    from pymysqlreplication import BinLogStreamReader

    return BinLogStreamReader(
        connection_settings={
            "host": "127.0.0.1",
            "port": server.port,
            "user": CDC_USER,
            "password": CDC_PASSWORD,
        },
        server_id=server_id,
        blocking=False,
        resume_stream=True,
        log_file=file,
        log_pos=pos,
        only_events=only_events,
        verify_checksum=True,
    )


def fresh_db(server: MariaDB) -> str:
    name = f"shop{next(_db_counter)}"
    with server.root() as c, c.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    return name


def source(server: MariaDB, tables: list[str], **extra: Any) -> MySQLSource:
    return MySQLSource(MySQLSourceConfig(id="my", dsn=server.dsn(), tables=tables, **extra), tenant="acme")


async def opened_on(
    server: MariaDB, columns: str = "id INT PRIMARY KEY", **extra: Any
) -> tuple[str, MySQLSource]:
    """A fresh database with one table ``t`` of ``columns``, and a source capturing it, opened
    with no checkpoint (it reads from now)."""
    db = fresh_db(server)
    with server.root(db) as c, c.cursor() as cur:
        cur.execute(f"CREATE TABLE {db}.t ({columns})")
    src = source(server, [f"{db}.t"], **extra)
    await src.open(None)
    return db, src


def to_file(
    server: MariaDB, name: str, tables: str, out: Path, store: MemoryCheckpointStore
) -> PipelineRunner:
    """A pipeline from ``tables`` to a JSONL file ``out``, checkpoints in ``store``."""
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "source": {"type": "mysql", "config": {"id": "my", "dsn": "${DSN}", "tables": [tables]}},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}],
            "storage": {"type": "memory"},
        },
    }
    return PipelineRunner(parse_pipeline(doc, env={"DSN": server.dsn()}), store=store)


async def read_n(src: MySQLSource, n: int, timeout: float = 30) -> list[Event]:
    out: list[Event] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < n:
        if loop.time() > deadline:
            raise AssertionError(f"read {len(out)} of {n} events")
        out.extend(e for e in await src.read() if e.op != "h")  # heartbeats: see the idle test
    return out


def purge_all_but_newest(server: MariaDB, gone: str) -> None:
    server.purge_all_but_newest(gone)


def purge_before(server: MariaDB, keep: str) -> None:
    """Purge every binlog before ``keep`` (retried: a closing dump thread may still hold one)."""
    import time

    deadline = time.monotonic() + 15
    with server.root() as c, c.cursor() as cur:
        while True:
            cur.execute(f"PURGE BINARY LOGS TO '{keep}'")
            cur.execute("SHOW BINARY LOGS")
            if next(r[0] for r in cur.fetchall()) == keep:
                return
            assert time.monotonic() < deadline, f"binlogs before {keep} were not purged"
            time.sleep(0.1)
