"""The JSON Schema of a pipeline document, generated from the same models that validate it.

``python -m deltaforge schema`` prints it. Point an editor's YAML language server at
the file and a pipeline is checked and completed as it is typed (see README). The
schema knows shapes and constraints; what only the running validator can tell
(``${VAR}`` set in the environment, templates, quorum against the sink count,
duplicate ids) ``deltaforge validate`` still checks.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from deltaforge.config import SPEC_FIELDS
from deltaforge.plugins import PROCESSORS, SINKS, SOURCES
from deltaforge.sections import (
    BatchConfig,
    CommitPolicy,
    JournalConfig,
    Metadata,
    StorageConfig,
    SupervisionConfig,
)
from deltaforge.transform.spec import SparkConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _entry(typ: str, ref: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"type": {"const": typ}, "config": ref, **(extra or {})},
        "required": ["type", "config"],
        "additionalProperties": False,
    }


def pipeline_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) for one pipeline document."""
    sections: dict[str, type[BaseModel]] = {
        "metadata": Metadata,
        "spark": SparkConfig,
        "batch": BatchConfig,
        "commit_policy": CommitPolicy,
        "supervision": SupervisionConfig,
        "storage": StorageConfig,
        "journal": JournalConfig,
    }
    sources = {name: p.config for name, p in SOURCES.items()}
    sinks = {name: p.config for name, p in SINKS.items()}
    models = [*sections.values(), *sources.values(), *sinks.values(), *PROCESSORS.values()]
    refs, top = models_json_schema([(m, "validation") for m in models], ref_template="#/$defs/{model}")

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return dict(refs[(model, "validation")])

    required = {"type": "boolean", "description": "Whether the commit policy waits for this sink."}
    properties: dict[str, Any] = {
        "source": {"oneOf": [_entry(n, ref(m)) for n, m in sources.items()]},
        "sinks": {
            "type": "array",
            "minItems": 1,
            "items": {"oneOf": [_entry(n, ref(m), {"required": required}) for n, m in sinks.items()]},
        },
        "processors": {"type": "array", "items": {"oneOf": [ref(m) for m in PROCESSORS.values()]}},
        **{k: ref(m) for k, m in sections.items() if k != "metadata"},
    }
    assert set(properties) == set(SPEC_FIELDS)  # the validator and the schema know the same spec
    spec = {
        "type": "object",
        "properties": properties,
        "required": ["source", "sinks"],
        "additionalProperties": False,
    }
    return {
        "$schema": DIALECT,
        "title": "deltaforge pipeline",
        "description": "One deltaforge pipeline (several may share a file as YAML documents).",
        "type": "object",
        "properties": {
            "apiVersion": {"const": "deltaforge/v1"},
            "kind": {"const": "Pipeline"},
            "metadata": ref(Metadata),
            "spec": spec,
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "$defs": top.get("$defs", {}),
    }
