"""What ``serve`` loads before its first event: a restart waits for every import.

The decoder children's libraries (psycopg, python-mysql-replication) belong in the children;
the web stack (uvicorn, Starlette) loads once the pipelines have started; rich is not loaded by
structlog (see ``deltaforge/leanstart.py``). And a source's decoder child is started as soon as
the configs are read, so that its own start-up runs beside serve's instead of after it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.helpers import jsonl, wait_until_sync
from tests.mysql_kit import fresh_db as my_fresh_db
from tests.postgres_kit import fresh_db as pg_fresh_db
from tests.serve_proc import CONSOLE_SCRIPT, PYTHON_M, serve_pipeline
from tests.servers.mariadb import MariaDB
from tests.servers.postgres import Postgres

LATER = ("psycopg", "pymysqlreplication", "uvicorn", "starlette", "rich")


def test_the_cli_and_the_sources_load_none_of_what_comes_later(tmp_path: Path) -> None:
    """Nor does a pipeline built as ``serve`` builds it: its snapshot chunk readers included (the
    PostgreSQL one had imported the decoder module for two constants, and with it psycopg)."""
    code = (
        "import sys, deltaforge.cli, deltaforge.sources.postgres.source, deltaforge.sources.mysql.source\n"
        "from deltaforge.config import parse_pipeline\n"
        "from deltaforge.pipeline.runner import PipelineRunner\n"
        "sources = [('postgres', {'dsn': 'postgresql://u@127.0.0.1:9/d', 'tables': ['public.t']}),\n"
        "           ('mysql', {'dsn': 'mysql://u@127.0.0.1:9/d', 'tables': ['d.t']})]\n"
        "for kind, config in sources:\n"
        "    spec = {'source': {'type': kind, 'config': {'id': 's', **config}},\n"
        "            'sinks': [{'type': 'stdout', 'config': {'id': 'o'}}],\n"
        "            'storage': {'type': 'sqlite', 'path': kind + '.db'}}\n"
        "    doc = {'apiVersion': 'deltaforge/v1', 'kind': 'Pipeline', 'metadata': {'name': kind}, 'spec': spec}\n"
        "    PipelineRunner(parse_pipeline(doc, env={}))\n"
        f"print(sorted(m for m in {LATER!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_decoder_child_that_makes_kafka_records_loads_no_logging_library(tmp_path: Path) -> None:
    """A child making each change's record (a Kafka sink with the native envelope) imports what
    makes them when its settings arrive, on the way to the first event: structlog, imported with
    the serve-side check beside them, took 100 ms of that."""
    code = (
        "import io, sys\n"
        "from deltaforge.sources.mysql.txevents import frame_sender as my\n"
        "from deltaforge.sources.postgres.frames import Transactions, frame_sender as pg\n"
        "my({'connector': 'mysql', 'tenant': 't', 'gen': 0}, '', io.BytesIO(), {})\n"
        "pg(Transactions('postgres', 't').opening(), io.BytesIO())\n"
        "print(sorted(m for m in ('structlog', 'rich', 'deltaforge.sources.making') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert out.stdout.strip() == "['deltaforge.sources.making']"


def _mariadb_pipeline(server: MariaDB, tmp: Path) -> tuple[dict[str, Any], Callable[[str], None]]:
    db = my_fresh_db(server)
    with server.root(db) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v TEXT)")

    def insert(v: str) -> None:
        with server.root(db) as c, c.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (1, %s)", (v,))

    return {"type": "mysql", "config": {"id": "my", "dsn": server.dsn(db), "tables": [f"{db}.t"]}}, insert


def _postgres_pipeline(server: Postgres, tmp: Path) -> tuple[dict[str, Any], Callable[[str], None]]:
    db = asyncio.run(pg_fresh_db(server))
    with psycopg.connect(server.dsn(db), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")

    def insert(v: str) -> None:
        with psycopg.connect(server.dsn(db), autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (1, %s)", (v,))

    config = {
        "id": "pg",
        "dsn": server.dsn(db),
        "slot": f"s_{db}",
        "publication": f"p_{db}",
        "tables": ["public.t"],
    }
    return {"type": "postgres", "config": config}, insert


@pytest.mark.parametrize(
    ("kind", "launcher"),
    [("mysql", PYTHON_M), ("postgres", PYTHON_M), ("mysql", CONSOLE_SCRIPT)],
    ids=["mysql", "postgres", "mysql-console-script"],
)
def test_serve_starts_each_decoder_child_before_its_pipeline_and_the_source_reads_through_it(
    kind: str, launcher: tuple[str, ...], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The child's start-up (Python, its libraries) overlaps serve's own instead of following it
    on the way to the first event (docs/performance.md, "Restart"); ``deltaforge serve`` (the
    installed script) starts as ``python -m deltaforge serve`` does."""
    server = request.getfixturevalue("mariadb" if kind == "mysql" else "postgres")
    source, insert = (_mariadb_pipeline if kind == "mysql" else _postgres_pipeline)(server, tmp_path)
    spec = {
        "source": source,
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp_path / "out.jsonl")}}],
    }
    module = f"deltaforge.sources.{kind}.decoder"
    with serve_pipeline(tmp_path, spec, launcher=launcher) as serve:
        insert("through the child")
        wait_until_sync(lambda: any(e["after"]["v"] == "through the child" for e in jsonl(tmp_path / "out.jsonl")),
                        timeout=30, what="the row in the file")  # fmt: skip
        started = next(e for e in jsonl(tmp_path / "log.jsonl") if e["event"] == "decoders_prestarted")
        decoders = [p.pid for p in psutil.Process(serve.proc.pid).children() if module in p.cmdline()]
        serve.terminate()
    assert started["module"] == module
    assert decoders == started["pids"]  # the one started ahead, and no other beside it
    assert started["before_imports"] == 1  # by ``earlystart``, from the YAML alone
    if kind == "postgres":
        with psycopg.connect(server.dsn(), autocommit=True) as conn:  # the session's slots are few
            conn.execute("SELECT pg_drop_replication_slot(%s)", (source["config"]["slot"],))


def test_python_m_deltaforge_serve_starts_the_decoder_children_its_config_names_before_its_imports(
    tmp_path: Path,
) -> None:
    """``earlystart`` reads the YAML alone: the children start before the config models (pydantic)
    and the rest of serve are imported. A config it cannot read starts nothing (serve says why)."""
    (tmp_path / "a.yaml").write_text(
        "metadata: {name: a}\nspec: {source: {type: postgres}}\n---\nspec: {source: {type: mysql}}\n"
    )
    (tmp_path / "b.yml").write_text("spec:\n  source: {type: postgres}\n")
    (tmp_path / "bad.yaml.txt").write_text("spec: {source: {type: mysql}}\n")  # not a config file
    code = (
        "import sys\n"
        "from deltaforge import earlystart\n"
        "from deltaforge.sources import childproc\n"
        "earlystart.decoders(sys.argv[1:])\n"
        "print({m: len(childproc.prestarted(m)) for m in childproc.DECODERS.values()}, 'pydantic' in sys.modules)\n"
        "childproc.discard_prestarted()\n"
    )

    def started(*argv: str) -> str:
        run = [sys.executable, "-c", code, *argv]
        return subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()

    both = "{'deltaforge.sources.mysql.decoder': %d, 'deltaforge.sources.postgres.decoder': %d} False"
    assert started("serve", "--config", str(tmp_path)) == both % (1, 2)
    assert started("serve", f"--config={tmp_path / 'b.yml'}", "--quiet") == both % (0, 1)
    # given twice, the last is the one serve reads (argparse's rule)
    assert started("serve", "--config", str(tmp_path), f"--config={tmp_path / 'b.yml'}") == both % (0, 1)
    assert started("serve", "--config", str(tmp_path / "b.yml"), "--config", str(tmp_path)) == both % (1, 2)
    (tmp_path / "c.yaml").write_text("spec: {source: [")  # does not read: nothing is guessed
    assert started("serve", "--config", str(tmp_path)) == both % (0, 0)
    assert started("validate", str(tmp_path / "b.yml")) == both % (0, 0)
    assert started("serve") == both % (0, 0)  # the default pipeline: Turso, no decoder
