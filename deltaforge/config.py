"""Pipeline configuration: DeltaForge-style YAML, ``${VAR}`` expansion, validation.

A bad config is rejected before anything starts, with every wrong field listed as
``path: what was expected`` (for example ``spec.sinks[1].config.path: required``).

This module parses the document and dispatches each plug-in's ``config`` to the model
its type registers (``deltaforge/plugins.py``); the models say what is allowed. The
sections that belong to no plug-in (``batch``, ``commit_policy``, ...) are modelled in
``sections.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from deltaforge import plugins
from deltaforge.configfiles import config_files
from deltaforge.configmodel import (
    Invalid,
    SinkConfig,
    SourceConfig,
    validate,
)
from deltaforge.sections import (
    BatchConfig,
    CommitPolicy,
    JournalConfig,
    Metadata,
    StorageConfig,
    SupervisionConfig,
)
from deltaforge.sharedreaders import shared_readers
from deltaforge.transform.spec import ProcessorSpec, SparkConfig, processor_spec

SPEC_FIELDS = (
    "source", "processors", "spark", "sinks", "batch", "commit_policy", "supervision", "storage", "journal",
)  # fmt: skip

_VAR = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that must not run; ``errors`` lists ``path: problem`` strings."""

    def __init__(self, errors: list[str], source: str = "config") -> None:
        self.errors = errors
        super().__init__(f"{source} is invalid:\n" + "\n".join(f"  - {e}" for e in errors))


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """One validated pipeline."""

    name: str
    tenant: str
    source: SourceConfig[Any]
    sinks: tuple[SinkConfig[Any], ...]
    processors: tuple[ProcessorSpec, ...] = ()
    spark: SparkConfig = field(default_factory=SparkConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    commit_policy: CommitPolicy = field(default_factory=CommitPolicy)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)


def expand_env(value: Any, path: str, env: Mapping[str, str], errors: list[str]) -> Any:
    """Replace ``${NAME}`` from ``env`` everywhere; leave ``${source.table}`` templates."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if _TEMPLATE.match(name):
                return match.group(0)  # a per-event template, expanded by the sink
            if not _NAME.match(name):
                errors.append(f"{path}: bad variable reference ${{{name}}}; expected ${{NAME}} or ${{a.b}}")
                return ""
            if name not in env:
                errors.append(f"{path}: environment variable {name} is not set")
                return ""
            return env[name]

        out = _VAR.sub(sub, value)
        if "${" in out.replace("$${", ""):
            tail = out[out.index("${") :]
            if "}" not in tail:
                errors.append(f"{path}: unclosed variable reference {tail!r}")
        return out
    if isinstance(value, list):
        return [expand_env(v, f"{path}[{i}]", env, errors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand_env(v, f"{path}.{k}", env, errors) for k, v in value.items()}
    return value


def _said_once(errors: list[str]) -> list[str]:
    """Without what a field's unresolved variable reference caused: the value it left (empty,
    or cut short) is not what the user wrote, so its other errors would only mislead."""

    def reference(e: str) -> bool:
        return ": environment variable " in e or ": bad variable reference " in e

    unresolved = {e.split(": ", 1)[0] for e in errors if reference(e)}
    return [e for e in errors if reference(e) or e.split(": ", 1)[0] not in unresolved]


def _section(model: type[M], raw: Any, path: str, errors: list[str]) -> M | None:
    """``raw`` as ``model``; problems go to ``errors`` (and None comes back)."""
    try:
        return validate(model, raw, path)
    except Invalid as exc:
        errors.extend(exc.errors)
        return None


def _entry(raw: Any, path: str, allowed: tuple[str, ...], errors: list[str]) -> tuple[str, dict[str, Any]]:
    """A ``{type, config}`` entry: its type and its config mapping (checked for shape only)."""
    if not isinstance(raw, Mapping):
        errors.append(
            f"{path}: "
            + ("required (a mapping)" if raw is None else f"expected a mapping, got {type(raw).__name__}")
        )
        return "", {}
    for key in raw:
        if key not in allowed:
            errors.append(f"{path}.{key}: unknown field; expected one of {', '.join(allowed)}")
    typ = raw.get("type")
    if not isinstance(typ, str) or not typ:
        errors.append(
            f"{path}.type: "
            + ("required (a string)" if typ is None else f"expected a non-empty string, got {typ!r}")
        )
        typ = ""
    cfg = raw.get("config")
    if not isinstance(cfg, Mapping):
        errors.append(
            f"{path}.config: "
            + ("required (a mapping)" if cfg is None else f"expected a mapping, got {type(cfg).__name__}")
        )
        cfg = {}
    return typ, dict(cfg)


def _source(raw: Any, errors: list[str]) -> SourceConfig[Any] | None:
    path = "spec.source"
    typ, cfg = _entry(raw, path, ("type", "config"), errors)
    plugin = plugins.SOURCES.get(typ)
    if plugin is None:
        if typ:
            errors.append(
                f"{path}.type: unknown source type {typ!r}; expected one of {', '.join(sorted(plugins.SOURCES))}"
            )
        return None
    settings = _section(plugin.config, cfg, f"{path}.config", errors)
    return SourceConfig(typ, settings) if settings is not None else None


def _sinks(raw: Any, errors: list[str]) -> list[SinkConfig[Any]]:
    if not isinstance(raw, list) or not raw:
        given = "an empty list" if isinstance(raw, list) else type(raw).__name__
        errors.append(
            "spec.sinks: "
            + (
                "required (a non-empty list of sinks)"
                if raw is None
                else f"expected a non-empty list of sinks, got {given}"
            )
        )
        return []
    out: list[SinkConfig[Any]] = []
    for i, item in enumerate(raw):
        path = f"spec.sinks[{i}]"
        typ, cfg = _entry(item, path, ("type", "config", "required"), errors)
        if isinstance(item, Mapping) and "required" in item and "required" not in cfg:
            cfg["required"] = item["required"]  # the entry-level spelling of config.required
        plugin = plugins.SINKS.get(typ)
        if plugin is None:
            if typ:
                errors.append(
                    f"{path}.type: unknown sink type {typ!r}; expected one of {', '.join(sorted(plugins.SINKS))}"
                )
            continue
        settings = _section(plugin.config, cfg, f"{path}.config", errors)
        if settings is not None:
            out.append(SinkConfig(typ, settings))
    ids = [
        item["config"].get("id")
        for item in raw
        if isinstance(item, Mapping) and isinstance(item.get("config"), Mapping)
    ]
    for dup in sorted({x for x in ids if isinstance(x, str) and x and ids.count(x) > 1}):
        errors.append(f"spec.sinks: sink id {dup!r} is used more than once")
    return out


def _processors(raw: Any, errors: list[str]) -> tuple[ProcessorSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        errors.append(f"spec.processors: expected a list of processors, got {type(raw).__name__}")
        return ()
    out: list[ProcessorSpec] = []
    for i, item in enumerate(raw):
        path = f"spec.processors[{i}]"
        typ = item.get("type") if isinstance(item, Mapping) else None
        model = plugins.PROCESSORS.get(typ) if isinstance(typ, str) else None
        if isinstance(item, Mapping) and model is None:
            errors.append(f"{path}.type: expected one of {', '.join(plugins.PROCESSORS)}, got {typ!r}")
            continue
        if model is None:
            errors.append(f"{path}: expected a mapping, got {type(item).__name__}")
            continue
        parsed = _section(model, item, path, errors)
        if parsed is not None:
            out.append(processor_spec(parsed, path))
    return tuple(out)


def _unknown(m: Mapping[str, Any], path: str, allowed: tuple[str, ...], errors: list[str]) -> None:
    for key in m:
        if key not in allowed:
            errors.append(f"{path}.{key}: unknown field; expected one of {', '.join(sorted(allowed))}")


def parse_pipeline(
    doc: Any, env: Mapping[str, str] | None = None, source_name: str = "config"
) -> PipelineConfig:
    """Validate one pipeline document; raise :class:`ConfigError` listing every problem."""
    env = os.environ if env is None else env
    errors: list[str] = []
    if not isinstance(doc, Mapping):
        raise ConfigError([f"(document): expected a mapping, got {type(doc).__name__}"], source_name)
    root = expand_env(dict(doc), "", env, errors)
    errors = [e.lstrip(".") for e in errors]
    if root.get("apiVersion") != "deltaforge/v1":
        errors.append(f"apiVersion: expected 'deltaforge/v1', got {root.get('apiVersion')!r}")
    if root.get("kind") != "Pipeline":
        errors.append(f"kind: expected 'Pipeline', got {root.get('kind')!r}")
    _unknown(root, "(document)", ("apiVersion", "kind", "metadata", "spec"), errors)
    meta = (
        _section(Metadata, root.get("metadata"), "metadata", errors)
        if root.get("metadata") is not None
        else None
    )
    if root.get("metadata") is None:
        errors.append("metadata: required (a mapping)")
    spec = root.get("spec")
    if not isinstance(spec, Mapping):
        errors.append(
            "spec: "
            + ("required (a mapping)" if spec is None else f"expected a mapping, got {type(spec).__name__}")
        )
        spec = {}
    _unknown(spec, "spec", SPEC_FIELDS, errors)
    source = _source(spec.get("source"), errors)
    sinks = _sinks(spec.get("sinks"), errors)
    processors = _processors(spec.get("processors"), errors)
    spark = _section(SparkConfig, spec.get("spark"), "spec.spark", errors)
    batch = _section(BatchConfig, spec.get("batch"), "spec.batch", errors)
    policy = _section(CommitPolicy, spec.get("commit_policy"), "spec.commit_policy", errors)
    n_sinks = len(spec["sinks"]) if isinstance(spec.get("sinks"), list) else 0
    if policy is not None and policy.mode == "quorum" and not 1 <= policy.quorum <= max(n_sinks, 1):
        errors.append(
            f"spec.commit_policy.quorum: expected 1..{n_sinks} with mode quorum, got {policy.quorum}"
        )
    if policy is not None and policy.mode == "required" and sinks and len(sinks) == n_sinks:  # noqa: SIM102
        if not any(s.required for s in sinks):
            errors.append(
                "spec.commit_policy.mode: 'required' needs at least one sink with required: true (every sink "
                "here is optional, so nothing would ever be checkpointed); mark one required, or use mode "
                "all or quorum"
            )
    supervision = _section(SupervisionConfig, spec.get("supervision"), "spec.supervision", errors)
    storage = _section(StorageConfig, spec.get("storage"), "spec.storage", errors)
    journal = _section(JournalConfig, spec.get("journal"), "spec.journal", errors)
    if errors:
        raise ConfigError(_said_once(errors), source_name)
    assert meta and source and spark and batch and policy and supervision and storage and journal
    return PipelineConfig(
        name=meta.name,
        # Two pipelines' changes may meet in one destination (NATS deduplicates a stream by the
        # key), and their sources' ids alone do not tell them apart: the name does.
        tenant=meta.tenant if meta.tenant is not None else meta.name,
        source=source,
        sinks=tuple(sinks),
        processors=processors,
        spark=spark,
        batch=batch,
        commit_policy=policy,
        supervision=supervision,
        journal=journal,
        storage=storage,
    )


def load(path: str | Path, env: Mapping[str, str] | None = None) -> list[PipelineConfig]:
    """Every pipeline in a YAML file (several documents allowed) or a folder of them."""
    p = Path(path)
    files = config_files(p)
    if not files:
        raise ConfigError([f"{p}: no *.yaml or *.yml files in this folder"], str(p))
    pipelines: list[PipelineConfig] = []
    errors: list[str] = []
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            errors.append(f"{f}: cannot read YAML: {exc}")
            continue
        if not docs:  # a file emptied by a deploy ran nothing, and said nothing of it
            errors.append(f"{f}: no pipeline in it (the file is empty, or holds only comments)")
        for i, doc in enumerate(docs):
            label = f"{f}" if len(docs) == 1 else f"{f}#{i}"
            try:
                pipelines.append(parse_pipeline(doc, env, label))
            except ConfigError as exc:
                errors.extend(f"{label}: {e}" for e in exc.errors)
    names = [pc.name for pc in pipelines]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"metadata.name: pipeline name {dup!r} is used more than once")
    errors += shared_readers(pipelines)
    if errors:
        raise ConfigError(errors, str(p))
    return pipelines
