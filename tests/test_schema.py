"""``deltaforge schema``: valid JSON Schema that accepts every documented example and
rejects what ``validate`` rejects; examples pass ``validate`` too."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deltaforge.config import SPEC_FIELDS, ConfigError, parse_pipeline
from deltaforge.schema import pipeline_schema
from tests.kit import doc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# What the documented ${VAR}s stand for, so the examples validate as they would on a real machine.
ENV = {
    "MYSQL_PW": "pw",
    "PG_PW": "pw",
    "PG_DSN": "postgresql://cdc:pw@127.0.0.1:5432/app",
    "TARGET_DSN": "postgresql://sink:pw@127.0.0.1:5432/replica",
    "KAFKA": "127.0.0.1:9092",
    "NATS": "nats://127.0.0.1:4222",
    "REDIS": "redis://127.0.0.1:6379/0",
}


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    out = subprocess.run(
        [sys.executable, "-m", "deltaforge", "schema"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)  # valid JSON Schema
    return jsonschema.Draft202012Validator(schema)


def readme_documents() -> list[tuple[str, dict[str, Any]]]:
    """Every ```yaml block of README.md as a whole pipeline document: whole documents as they
    are, ``spec`` fragments and sink entries placed into a minimal document."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert blocks, "README.md has no yaml examples"
    out = []
    for i, block in enumerate(blocks):
        data = yaml.safe_load(block)
        base = doc(storage={"type": "sqlite", "path": "./data/cp.db"})
        del base["spec"]["supervision"]
        if isinstance(data, dict) and "apiVersion" in data:
            d = data
        elif isinstance(data, dict) and set(data) <= set(SPEC_FIELDS):
            d = copy.deepcopy(base)
            d["spec"].update(data)
        elif isinstance(data, list):
            d = copy.deepcopy(base)
            d["spec"]["sinks"] = data
        else:
            raise AssertionError(
                f"README yaml block {i} is neither a document, spec fields nor sinks: {block}"
            )
        out.append((f"README.md block {i}", d))
    return out


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    assert EXAMPLES, "examples/ is empty"
    return [(p.name, d) for p in EXAMPLES for d in yaml.safe_load_all(p.read_text())]


def test_every_source_and_sink_type_has_an_example() -> None:
    from deltaforge.plugins import SINKS, SOURCES

    docs = [d for _, d in example_documents()]
    assert {d["spec"]["source"]["type"] for d in docs} == set(SOURCES)
    assert {s["type"] for d in docs for s in d["spec"]["sinks"]} == set(SINKS)


@pytest.mark.parametrize(("name", "document"), readme_documents() + example_documents())
def test_documented_examples_pass_the_schema_and_validate(
    validator: jsonschema.Draft202012Validator, name: str, document: dict[str, Any]
) -> None:
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]
    assert not errors, f"{name}: {errors}"
    used = set(_VAR.findall(json.dumps(document)))
    assert used <= set(ENV), f"{name} uses undocumented variables {used - set(ENV)}"
    parse_pipeline(document, env=ENV, source_name=name)


def test_examples_pass_the_validate_command() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "deltaforge", "validate", str(ROOT / "examples")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok: pipeline") == len(example_documents())


def test_schema_rejects_an_unknown_sink_option(validator: jsonschema.Draft202012Validator) -> None:
    d = doc(
        sinks=[{"type": "kafka", "config": {"id": "k", "brokers": "b:9092", "topic": "t", "lingerr_ms": 5}}]
    )
    assert not validator.is_valid(d)
    assert any("lingerr_ms" in e.message for e in validator.iter_errors(d) for e in [e, *e.context])
    with pytest.raises(ConfigError, match=r"spec\.sinks\[0\]\.config\.lingerr_ms: unknown field"):
        parse_pipeline(d, env={})
    d["spec"]["sinks"][0]["config"].pop("lingerr_ms")
    assert validator.is_valid(d)


def test_schema_and_validate_agree_on_types_and_choices(validator: jsonschema.Draft202012Validator) -> None:
    for bad in (
        doc(batch={"max_events": 0}),
        doc(commit_policy={"mode": "most"}),
        doc(sinks=[{"type": "stdout", "config": {"id": "a", "format": "xml"}}]),
        doc(sinks=[{"type": "carrier-pigeon", "config": {"id": "p"}}]),
        doc(supervision={"strategy": "one_for_one"}),
    ):
        assert not validator.is_valid(bad)
        with pytest.raises(ConfigError):
            parse_pipeline(bad, env={})


def test_schema_is_what_the_module_builds() -> None:
    assert pipeline_schema()["properties"]["spec"]["required"] == ["source", "sinks"]
