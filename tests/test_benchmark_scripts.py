"""Each benchmark whose docstring says to run it as ``python benchmarks/<name>.py`` starts that way.

CI runs the suite as ``python -m benchmarks``, which imports them as a package and so cannot
notice a script that only works as a module (``benchmarks.spark_transform`` once did not).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def documented_scripts() -> list[str]:
    """Scripts named in their own module docstring's usage line."""
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if re.search(rf"python benchmarks/{re.escape(path.name)}\b", doc):
            found.append(path.name)
    return found


def test_the_benchmarks_say_how_to_run_them() -> None:
    assert "spark_transform.py" in documented_scripts()
    assert len(documented_scripts()) >= 8


@pytest.mark.parametrize("script", documented_scripts())
def test_a_documented_benchmark_script_starts_from_any_directory(script: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        cwd=tmp_path,  # not the project root: the script finds its own packages
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:"), r.stdout[:500]
