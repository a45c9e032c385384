"""Pipeline configuration: DeltaForge-style YAML, ``${VAR}`` expansion, validation.

A bad config is rejected before anything starts, with every wrong field listed as
``path: what was expected`` (for example ``spec.sinks[1].config.path: required``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deltaforge.configcheck import Checker
from deltaforge.transform.spec import ProcessorSpec, SparkConfig, parse_processors, parse_spark

SOURCE_TYPES = {"turso", "mysql", "postgres"}
SINK_TYPES = {"stdout", "file", "redis", "nats", "kafka", "postgres"}
# Known to the design but delivered by later work; named so the error says so.
PLANNED_SOURCES: set[str] = set()
PLANNED_SINKS: set[str] = set()
# one_for_one is not offered at the pipeline level: see pipeline/tree.py for why.
STRATEGIES = ("one_for_all", "rest_for_one")
COMMIT_MODES = ("required", "all", "quorum")
STORAGE_TYPES = ("sqlite", "file", "memory")
ENVELOPES = ("native", "debezium", "cloudevents")

_VAR = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class ConfigError(ValueError):
    """A config that must not run; ``errors`` lists ``path: problem`` strings."""

    def __init__(self, errors: list[str], source: str = "config") -> None:
        self.errors = errors
        super().__init__(f"{source} is invalid:\n" + "\n".join(f"  - {e}" for e in errors))


@dataclass(frozen=True, slots=True)
class SourceConfig:
    type: str
    id: str
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SinkConfig:
    type: str
    id: str
    required: bool
    envelope: str
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BatchConfig:
    max_events: int = 2000
    max_bytes: int = 16 * 1024 * 1024
    max_ms: int = 50
    respect_source_tx: bool = True
    max_inflight: int = 1


@dataclass(frozen=True, slots=True)
class CommitPolicy:
    mode: str = "required"
    quorum: int = 0


@dataclass(frozen=True, slots=True)
class SupervisionConfig:
    strategy: str = "one_for_all"
    max_restarts: int = 5
    within_seconds: float = 60.0
    backoff_base_ms: int = 100
    backoff_max_ms: int = 10_000


@dataclass(frozen=True, slots=True)
class StorageConfig:
    type: str = "sqlite"
    path: str = "./data/deltaforge.db"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """One validated pipeline."""

    name: str
    tenant: str
    source: SourceConfig
    sinks: tuple[SinkConfig, ...]
    processors: tuple[ProcessorSpec, ...] = ()
    spark: SparkConfig = field(default_factory=SparkConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    commit_policy: CommitPolicy = field(default_factory=CommitPolicy)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)


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


def _envelope(c: Checker, raw: Any, path: str) -> str:
    if raw is None:
        return "native"
    if isinstance(raw, str):
        name = raw
    elif isinstance(raw, Mapping):
        name = raw.get("type", "native")
    else:
        c.err(path, f"expected an envelope name or {{type: ...}}, got {raw!r}")
        return "native"
    if name not in ENVELOPES:
        c.err(path, f"expected one of {', '.join(ENVELOPES)}, got {name!r}")
        return "native"
    return str(name)


def _source(c: Checker, raw: Any) -> SourceConfig:
    path = "spec.source"
    m = c.mapping(raw, path)
    typ = c.string(m, "type", path)
    cfg = c.mapping(m.get("config"), f"{path}.config")
    if typ and typ not in SOURCE_TYPES:
        if typ in PLANNED_SOURCES:
            c.err(f"{path}.type", f"source type {typ!r} is not available in this version")
        else:
            c.err(
                f"{path}.type",
                f"unknown source type {typ!r}; expected one of {', '.join(sorted(SOURCE_TYPES))}",
            )
    sid = c.string(cfg, "id", f"{path}.config") if cfg else ""
    if typ == "turso":
        cp = f"{path}.config"
        c.string(cfg, "path", cp)
        if "tables" in cfg and not (
            isinstance(cfg["tables"], list) and all(isinstance(t, str) for t in cfg["tables"])
        ):
            c.err(f"{cp}.tables", f"expected a list of table names, got {cfg['tables']!r}")
        c.integer(cfg, "poll_interval_ms", cp, 50, minimum=1)
        c.integer(cfg, "read_chunk", cp, 2000, minimum=1)
        w = cfg.get("workload")
        if w is not None:
            wm = c.mapping(w, f"{cp}.workload")
            c.unknown(wm, f"{cp}.workload", {"enabled", "rows_per_second", "max_rows"})
            c.boolean(wm, "enabled", f"{cp}.workload", True)
            c.number(wm, "rows_per_second", f"{cp}.workload", 20.0)
            c.integer(wm, "max_rows", f"{cp}.workload", 0)
        c.unknown(cfg, cp, {"id", "path", "tables", "poll_interval_ms", "read_chunk", "workload"})
    if typ == "mysql":
        cp = f"{path}.config"
        dsn = c.string(cfg, "dsn", cp)
        if dsn and not re.match(r"^(mysql|mariadb)://[^/]+", dsn):
            c.err(f"{cp}.dsn", "expected mysql://user:password@host:port/db")
        tables = cfg.get("tables")
        if tables is not None and not (
            isinstance(tables, list) and all(isinstance(t, str) and "." in t for t in tables)
        ):
            c.err(f"{cp}.tables", "expected a list of db.table names (db.* allowed)")
        if "server_id" in cfg:
            c.integer(cfg, "server_id", cp, 0, minimum=1)
        c.integer(cfg, "read_chunk", cp, 2000, minimum=1)
        c.unknown(cfg, cp, {"id", "dsn", "tables", "server_id", "read_chunk"})
    if typ == "postgres":
        cp = f"{path}.config"
        dsn = c.string(cfg, "dsn", cp)
        if dsn and not re.match(r"^postgres(ql)?://", dsn):
            c.err(f"{cp}.dsn", "expected postgresql://user:password@host:port/db")
        for key in ("slot", "publication"):
            if key in cfg:
                name = c.string(cfg, key, cp)
                if name and not re.match(r"^[a-z_][a-z0-9_]*$", name):
                    c.err(f"{cp}.{key}", f"expected a lower-case identifier, got {name!r}")
        tables = cfg.get("tables")
        if tables is not None and not (isinstance(tables, list) and all(isinstance(t, str) for t in tables)):
            c.err(f"{cp}.tables", "expected a list of schema.table names")
        c.boolean(cfg, "create", cp, True)
        for key, default in (("read_chunk", 5000), ("heartbeat_ms", 10_000), ("poll_interval_ms", 100)):
            c.integer(cfg, key, cp, default, minimum=1)
        c.unknown(
            cfg,
            cp,
            {
                "id",
                "dsn",
                "slot",
                "publication",
                "tables",
                "create",
                "read_chunk",
                "heartbeat_ms",
                "poll_interval_ms",
            },
        )
    return SourceConfig(type=typ, id=sid, config=cfg)


def _sink(c: Checker, raw: Any, i: int, extra_sink_types: set[str]) -> SinkConfig:
    path = f"spec.sinks[{i}]"
    m = c.mapping(raw, path)
    typ = c.string(m, "type", path)
    cfg = c.mapping(m.get("config"), f"{path}.config")
    cp = f"{path}.config"
    known = SINK_TYPES | extra_sink_types
    if typ and typ not in known:
        if typ in PLANNED_SINKS:
            c.err(f"{path}.type", f"sink type {typ!r} is not available in this version")
        else:
            c.err(f"{path}.type", f"unknown sink type {typ!r}; expected one of {', '.join(sorted(known))}")
    sid = c.string(cfg, "id", cp) if cfg else ""
    required = c.boolean(cfg, "required", cp, c.boolean(m, "required", path, True))
    envelope = _envelope(c, cfg.get("envelope"), f"{cp}.envelope")
    if typ == "file":
        c.string(cfg, "path", cp)
        c.boolean(cfg, "fsync", cp, True)
        c.unknown(cfg, cp, {"id", "path", "fsync", "envelope", "required"})
    elif typ == "postgres":
        dsn = c.string(cfg, "dsn", cp)
        if dsn and not re.match(r"^postgres(ql)?://", dsn):
            c.err(f"{cp}.dsn", "expected postgresql://user:password@host:port/db")
        keys = cfg.get("key_columns")
        if not (isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys)):
            c.err(f"{cp}.key_columns", "required (a non-empty list of the target's primary-key columns)")
        c.choice(cfg, "upsert_strategy", cp, ("always", "if_newer"), "always")
        if "table" in cfg:
            from deltaforge.sinks.templates import check_template

            text = c.string(cfg, "table", cp)
            problem = check_template(text) if text else None
            if problem:
                c.err(f"{cp}.table", problem)
        if "position_column" in cfg:
            c.string(cfg, "position_column", cp)
        c.unknown(
            cfg,
            cp,
            {
                "id",
                "dsn",
                "table",
                "key_columns",
                "upsert_strategy",
                "position_column",
                "envelope",
                "required",
            },
        )
    elif typ == "kafka":
        c.string(cfg, "brokers", cp)
        from deltaforge.sinks.templates import check_template

        for key in ("topic", "key"):
            if key == "topic" or key in cfg:
                text = c.string(cfg, key, cp)
                problem = check_template(text) if text else None
                if problem:
                    c.err(f"{cp}.{key}", problem)
        c.boolean(cfg, "exactly_once", cp, False)
        c.number(cfg, "timeout_s", cp, 30.0)
        if "producer" in cfg:
            c.mapping(cfg["producer"], f"{cp}.producer")
        c.unknown(
            cfg,
            cp,
            {
                "id",
                "brokers",
                "topic",
                "key",
                "exactly_once",
                "timeout_s",
                "producer",
                "envelope",
                "required",
            },
        )
    elif typ == "nats":
        url = c.string(cfg, "url", cp)
        if url and not re.match(r"^(nats|tls)://", url):
            c.err(f"{cp}.url", "expected nats://host:port")
        subject = c.string(cfg, "subject", cp)
        if subject:
            from deltaforge.sinks.templates import check_template

            problem = check_template(subject)
            if problem:
                c.err(f"{cp}.subject", problem)
        if "stream" in cfg:
            c.string(cfg, "stream", cp)
        c.boolean(cfg, "create_stream", cp, "stream" in cfg)
        c.number(cfg, "duplicate_window_s", cp, 120.0)
        c.number(cfg, "ack_timeout_s", cp, 10.0)
        c.unknown(
            cfg,
            cp,
            {"id", "url", "subject", "stream", "stream_subjects", "create_stream", "duplicate_window_s",
             "ack_timeout_s", "envelope", "required"},
        )  # fmt: skip
    elif typ == "redis":
        uri = c.string(cfg, "uri", cp)
        if uri and not re.match(r"^rediss?://", uri):
            c.err(f"{cp}.uri", "expected redis://[user:password@]host:port[/db]")
        stream = c.string(cfg, "stream", cp)
        if stream:
            from deltaforge.sinks.templates import check_template

            problem = check_template(stream)
            if problem:
                c.err(f"{cp}.stream", problem)
        c.integer(cfg, "maxlen", cp, 0, minimum=0)
        c.boolean(cfg, "exactly_once", cp, False)
        c.unknown(cfg, cp, {"id", "uri", "stream", "maxlen", "exactly_once", "envelope", "required"})
    elif typ == "stdout":
        c.choice(cfg, "format", cp, ("pretty", "json"), "json")
        c.unknown(cfg, cp, {"id", "format", "envelope", "required"})
    return SinkConfig(type=typ, id=sid, required=required, envelope=envelope, config=cfg)


def parse_pipeline(
    doc: Any,
    env: Mapping[str, str] | None = None,
    source_name: str = "config",
    extra_sink_types: set[str] | None = None,
) -> PipelineConfig:
    """Validate one pipeline document; raise :class:`ConfigError` listing every problem."""
    env = os.environ if env is None else env
    c = Checker()
    root = c.mapping(doc, "(document)")
    if not c.errors:
        root = expand_env(root, "", env, c.errors)
        c.errors = [e.lstrip(".") for e in c.errors]
    if root.get("apiVersion") != "deltaforge/v1":
        c.err("apiVersion", f"expected 'deltaforge/v1', got {root.get('apiVersion')!r}")
    if root.get("kind") != "Pipeline":
        c.err("kind", f"expected 'Pipeline', got {root.get('kind')!r}")
    c.unknown(root, "(document)", {"apiVersion", "kind", "metadata", "spec"})
    meta = c.mapping(root.get("metadata"), "metadata")
    name = c.string(meta, "name", "metadata")
    tenant = c.string(meta, "tenant", "metadata", default="default")
    spec = c.mapping(root.get("spec"), "spec")
    c.unknown(
        spec,
        "spec",
        {"source", "processors", "spark", "sinks", "batch", "commit_policy", "supervision", "storage"},
    )
    source = _source(c, spec.get("source"))
    sinks_raw = spec.get("sinks")
    sinks: list[SinkConfig] = []
    if not isinstance(sinks_raw, list) or not sinks_raw:
        c.err("spec.sinks", "required (a non-empty list of sinks)")
    else:
        sinks = [_sink(c, s, i, extra_sink_types or set()) for i, s in enumerate(sinks_raw)]
        ids = [s.id for s in sinks if s.id]
        for dup in sorted({x for x in ids if ids.count(x) > 1}):
            c.err("spec.sinks", f"sink id {dup!r} is used more than once")
    processors = parse_processors(c, spec.get("processors"))
    spark = parse_spark(c, spec.get("spark"))
    bm = c.mapping(spec.get("batch"), "spec.batch", required=False)
    c.unknown(bm, "spec.batch", {"max_events", "max_bytes", "max_ms", "respect_source_tx", "max_inflight"})
    batch = BatchConfig(
        max_events=c.integer(bm, "max_events", "spec.batch", 2000, 1),
        max_bytes=c.integer(bm, "max_bytes", "spec.batch", 16 * 1024 * 1024, 1),
        max_ms=c.integer(bm, "max_ms", "spec.batch", 50, 1),
        respect_source_tx=c.boolean(bm, "respect_source_tx", "spec.batch", True),
        max_inflight=c.integer(bm, "max_inflight", "spec.batch", 1, 1),
    )
    pm = c.mapping(spec.get("commit_policy"), "spec.commit_policy", required=False)
    c.unknown(pm, "spec.commit_policy", {"mode", "quorum"})
    mode = c.choice(pm, "mode", "spec.commit_policy", COMMIT_MODES, "required")
    quorum = c.integer(pm, "quorum", "spec.commit_policy", 0, 0)
    if mode == "quorum" and not 1 <= quorum <= max(len(sinks), 1):
        c.err("spec.commit_policy.quorum", f"expected 1..{len(sinks)} with mode quorum, got {quorum}")
    sm = c.mapping(spec.get("supervision"), "spec.supervision", required=False)
    c.unknown(sm, "spec.supervision", {"strategy", "max_restarts", "within_seconds", "backoff"})
    backoff = c.mapping(sm.get("backoff"), "spec.supervision.backoff", required=False)
    c.unknown(backoff, "spec.supervision.backoff", {"base_ms", "max_ms"})
    supervision = SupervisionConfig(
        strategy=c.choice(sm, "strategy", "spec.supervision", STRATEGIES, "one_for_all"),
        max_restarts=c.integer(sm, "max_restarts", "spec.supervision", 5, 0),
        within_seconds=c.number(sm, "within_seconds", "spec.supervision", 60.0),
        backoff_base_ms=c.integer(backoff, "base_ms", "spec.supervision.backoff", 100, 0),
        backoff_max_ms=c.integer(backoff, "max_ms", "spec.supervision.backoff", 10_000, 0),
    )
    stm = c.mapping(spec.get("storage"), "spec.storage", required=False)
    c.unknown(stm, "spec.storage", {"type", "path"})
    storage = StorageConfig(
        type=c.choice(stm, "type", "spec.storage", STORAGE_TYPES, "sqlite"),
        path=str(stm.get("path", "./data/deltaforge.db")),
    )
    if c.errors:
        raise ConfigError(c.errors, source_name)
    return PipelineConfig(
        name=name,
        tenant=tenant,
        source=source,
        sinks=tuple(sinks),
        processors=processors,
        spark=spark,
        batch=batch,
        commit_policy=CommitPolicy(mode=mode, quorum=quorum),
        supervision=supervision,
        storage=storage,
    )


def load(path: str | Path, env: Mapping[str, str] | None = None) -> list[PipelineConfig]:
    """Every pipeline in a YAML file (several documents allowed) or a folder of them."""
    p = Path(path)
    files = sorted([*p.glob("*.yaml"), *p.glob("*.yml")]) if p.is_dir() else [p]
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
        for i, doc in enumerate(docs):
            label = f"{f}" if len(docs) == 1 else f"{f}#{i}"
            try:
                pipelines.append(parse_pipeline(doc, env, label))
            except ConfigError as exc:
                errors.extend(f"{label}: {e}" for e in exc.errors)
    names = [pc.name for pc in pipelines]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"metadata.name: pipeline name {dup!r} is used more than once")
    if errors:
        raise ConfigError(errors, str(p))
    return pipelines
