"""What ``serve`` loads before its first event: a restart waits for every import.

The decoder children's libraries (psycopg, python-mysql-replication) belong in the children;
the web stack (uvicorn, Starlette) loads once the pipelines have started; rich is not loaded by
structlog (see ``deltaforge/leanstart.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LATER = ("psycopg", "pymysqlreplication", "uvicorn", "starlette", "rich")


def test_the_cli_and_the_sources_load_none_of_what_comes_later(tmp_path: Path) -> None:
    code = (
        "import sys, deltaforge.cli, deltaforge.sources.postgres.source, deltaforge.sources.mysql.source\n"
        f"print(sorted(m for m in {LATER!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert out.stdout.strip() == "[]"
