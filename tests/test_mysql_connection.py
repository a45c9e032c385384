"""The MySQL/MariaDB source's connections: TLS, a half-open network, a lost stream."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from chaos.harness import ProxyServer, port_of
from deltaforge.sources.base import SourceUnavailable
from deltaforge.sources.mysql.checks import MySQLSettings
from deltaforge.sources.mysql.config import MySQLSourceConfig
from deltaforge.sources.mysql.source import MySQLSource
from tests.helpers import jsonl, wait_until_sync
from tests.mysql_kit import fresh_db, read_n, source
from tests.serve_proc import serve_pipeline
from tests.servers.mariadb import MariaDB


def _status(cur: Any, name: str) -> int:
    cur.execute(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return int(cur.fetchone()[1])


async def test_a_server_offering_tls_is_read_over_tls_with_one_shared_context(
    tls_pair: tuple[Path, Path],
) -> None:
    """No TLS settings means pymysql's PREFERRED mode — TLS whenever the server offers it — for
    the checks and the decoder child's connections alike; the context is built once per process,
    not once per connection with the system CA bundle loaded (``connection.py``)."""
    key, cert = tls_pair
    with MariaDB(extra_args=[f"--ssl-cert={cert}", f"--ssl-key={key}"]) as server:
        db = fresh_db(server)
        with server.root(db) as c, c.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        settings = MySQLSettings.from_dsn(server.dsn())
        with settings.connect() as mon, settings.connect() as other, mon.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1], "the connection is not encrypted"
            assert mon.ctx is other.ctx
            connections, handshakes = _status(cur, "Connections"), _status(cur, "Ssl_accepts")
            src = source(server, [f"{db}.t"])
            await src.open(None)
            with server.root(db) as c, c.cursor() as ins:
                ins.execute("INSERT INTO t VALUES (1)")
            events = await read_n(src, 1)
            await src.close()
            opened = _status(cur, "Connections") - connections
            assert [e.after for e in events] == [{"id": 1}]
            assert opened >= 4  # the checks', the decoder's control and stream connections, the INSERT's
            assert _status(cur, "Ssl_accepts") - handshakes == opened  # every one of them over TLS


async def test_a_half_open_network_is_unavailable_not_a_silent_stall(
    mariadb: MariaDB, proxies: ProxyServer
) -> None:
    """The network stops passing anything and closes nothing (a dead route, a firewall dropping
    packets): with no read timeout, the stream waited forever on a socket that would never speak
    again, the pipeline saying ok, and a reconnect hung in its handshake the same way. The stream
    misses the server's heartbeats (every 50 ms) and reports the server unavailable after
    ``STALL_S``; a short connection's query gives up after its timeout."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    proxy = proxies.proxy("my", f"127.0.0.1:{mariadb.port}")
    dsn = mariadb.dsn().replace(f":{mariadb.port}/", f":{port_of(proxy)}/")
    src = MySQLSource(MySQLSourceConfig(id="my", dsn=dsn, tables=[f"{db}.t"]), tenant="acme")
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1)")
    await read_n(src, 1)
    for stream in ("downstream", "upstream"):
        proxy.add_toxic(name=f"hole_{stream}", type="timeout", stream=stream, attributes={"timeout": 0})
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(SourceUnavailable, match="timed out"):
        while loop.time() - began < 60:
            await src.read()
    await src.close()
    src.settings = dataclasses.replace(src.settings, query_timeout_s=2.0)
    with pytest.raises(SourceUnavailable, match="timed out"):
        await asyncio.wait_for(src.identity(), 60)


async def test_a_lost_stream_connection_reopens_from_the_checkpoint_not_replaying_the_session(
    mariadb: MariaDB,
) -> None:
    """python-mysql-replication reconnects by itself when its connection drops (here: the dump
    thread is killed on the server), from the GTID it was started at: every transaction of the
    session came again, and after a failover it would reconnect to another server unreconciled.
    The loss is reported instead (unavailable), and the source reopened from its checkpoint
    reads only what came after it."""
    db = fresh_db(mariadb)
    with mariadb.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    src = source(mariadb, [f"{db}.t"])
    await src.open(None)
    with mariadb.root(db) as c, c.cursor() as cur:
        for i in range(1, 6):
            cur.execute("INSERT INTO t VALUES (%s)", (i,))
    first = await read_n(src, 5)
    with mariadb.root() as c, c.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%%'")
        for (thread,) in cur.fetchall():
            cur.execute(f"KILL {int(thread)}")
        for i in range(6, 11):
            cur.execute(f"INSERT INTO {db}.t VALUES (%s)", (i,))
    with pytest.raises(SourceUnavailable, match="Lost connection"):
        await read_n(src, 100)
    await src.close()
    again = source(mariadb, [f"{db}.t"])
    await again.open(first[-1].checkpoint)
    assert [e.after["id"] for e in await read_n(again, 5) if e.after] == [6, 7, 8, 9, 10]
    await again.close()


def test_a_stop_does_not_wait_for_a_question_a_stopped_server_never_answers(tmp_path: Path) -> None:
    """A server alive but answering nothing (its process stopped, its host frozen) takes a short
    connection's question and holds it for ``query_timeout_s``: a stop meanwhile waited for the
    reader's opening (the drain's 30 s, ``pipeline_drain_incomplete``), and after
    ``shutdown_complete`` the interpreter joined the thread asking for the rest (58 s from the
    signal at the default 60 s). Neither waits for it now."""
    with MariaDB() as server:
        db = fresh_db(server)
        with server.root(db) as c, c.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        config = {"id": "my", "dsn": server.dsn(), "tables": [f"{db}.t"], "query_timeout_s": 600}
        spec = {
            "source": {"type": "mysql", "config": config},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "out.jsonl")}}],
        }
        with serve_pipeline(tmp_path, spec) as serve:
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                # The stream misses the stopped server's heartbeats, the source opens again,
                # and its first question waits on a connection the kernel accepted for it.
                wait_until_sync(
                    lambda: "MySQLSource._with_connection" in (serve.ask_waits() or ""),
                    90,
                    "a question waiting on the stopped server",
                )
                assert serve.terminate(timeout=60) == 0
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
        said = [e["event"] for e in jsonl(tmp_path / "log.jsonl")]
        # The drain did not wait for the reader's opening, which has read nothing since.
        assert "pipeline_drained" in said and "pipeline_drain_incomplete" not in said, said[-20:]
