"""What the documentation names as proof exists: each test it cites, each chaos scenario it runs.

``docs/guarantees.md`` gives every guarantee the test that proves it. A test renamed or moved
would leave the row pointing at nothing, and a reader would trust a proof that is gone.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from chaos.scenarios import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# A full reference, ``tests/test_x.py::test_name``, or one that continues the last file named on
# the same line, ``::test_name``.
TEST_REF = re.compile(r"(tests/[\w/]+\.py)?((?:::\w+)+)")
TEST_FILE = re.compile(r"tests/[\w/]+\.py")
CHAOS_RUN = re.compile(r"python -m chaos run ((?:[a-z_]+ ?)+)|chaos `([a-z_]+)`")


@cache
def defined_names(path: Path) -> frozenset[str]:
    """``name`` and ``Class::method`` for every test function and class the module defines."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}::{item.name}")
    return frozenset(names)


def cited_tests() -> list[tuple[str, str, str]]:
    """``(where, file, name)`` for every test the documentation cites."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            current: str | None = None
            for match in TEST_REF.finditer(line):
                current = match.group(1) or current
                if current is None:
                    continue  # "::" in other text (a C++ name, say), with no test file before it
                found.append((f"{doc.name}:{number}", current, match.group(2)[2:]))
    return found


def chaos_references() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for match in CHAOS_RUN.finditer(line):
                names = (match.group(1) or match.group(2)).split()
                found += [(f"{doc.name}:{number}", name) for name in names]
    return found


def test_the_documentation_cites_tests_and_scenarios() -> None:
    refs = cited_tests()
    assert len(refs) >= 100
    assert any(where.startswith("guarantees.md") for where, _, _ in refs)
    assert len(chaos_references()) >= 10


def test_every_cited_test_exists() -> None:
    missing = [
        f"{where}: {file}::{name}"
        for where, file, name in cited_tests()
        if not (ROOT / file).is_file() or name not in defined_names(ROOT / file)
    ]
    assert not missing, "cited but not defined:\n" + "\n".join(missing)


@pytest.mark.parametrize("text", ["`tests/test_nowhere.py::test_gone`", "`tests/test_docs.py::test_renamed`"])
def test_a_citation_of_a_test_that_is_gone_is_caught(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "guarantees.md"
    doc.write_text(f"| a guarantee | {text}, `::test_docstring_examples_run` |\n")
    monkeypatch.setitem(globals(), "DOCS", [doc])
    with pytest.raises(AssertionError, match="cited but not defined"):
        test_every_cited_test_exists()


def test_every_cited_test_module_exists() -> None:
    cited = {(doc.name, m.group()) for doc in DOCS for m in TEST_FILE.finditer(doc.read_text())}
    missing = sorted(f"{where}: {file}" for where, file in cited if not (ROOT / file).is_file())
    assert not missing, "no such test module:\n" + "\n".join(missing)


def test_every_guarantee_names_its_proof() -> None:
    """Each row of the guarantees' tables cites a test or a chaos scenario."""
    lines = (ROOT / "docs" / "guarantees.md").read_text().splitlines()
    rows = [
        (number, line)
        for number, line in enumerate(lines, 1)
        if line.startswith("|")
        and not re.match(r"\|[\s|:-]*$", line)  # not a |---| separator
        and "Proven by |" not in line  # not a header
    ]
    assert len(rows) >= 50
    unproven = [
        f"guarantees.md:{n}: {line[:120]}"
        for n, line in rows
        if not (TEST_FILE.search(line) or CHAOS_RUN.search(line))
    ]
    assert not unproven, "no test or scenario named:\n" + "\n".join(unproven)


def test_every_chaos_scenario_run_exists() -> None:
    allowed = set(BY_NAME) | {"all", "quick"}
    missing = [f"{where}: {name}" for where, name in chaos_references() if name not in allowed]
    assert not missing, "no such chaos scenario:\n" + "\n".join(missing)
