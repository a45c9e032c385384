"""How a plug-in declares its configuration: a pydantic model built from these field types.

Each source, sink and processor owns one model (fields, types, defaults, constraints and a
one-line description each); ``deltaforge/config.py`` validates a document against them and
``deltaforge schema`` prints their JSON Schema. The field types carry deltaforge's wording,
so every plug-in reports a mistake the same way::

    >>> from pydantic import Field
    >>> class Example(PluginConfig):
    ...     path: Text = Field(description="Where to write.")
    ...     every_ms: PositiveInt = Field(50, description="How often.")
    >>> validate(Example, {"every_ms": "often", "colour": 1}, "spec.x")
    Traceback (most recent call last):
    ...
    deltaforge.configmodel.Invalid: spec.x.path: required (a string); spec.x.every_ms: expected an integer >= 1, got 'often'; spec.x.colour: unknown field; expected one of every_ms, path
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic import WithJsonSchema as WithJsonSchema
from pydantic_core import PydanticCustomError

from deltaforge.configaddrs import url_problem
from deltaforge.redact import names_secret

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Hint:
    """What a required field holds, for ``required (a string)``."""

    text: str


def fail(message: str) -> typing.NoReturn:
    """Reject a value with exactly ``message`` (used by validators)."""
    raise PydanticCustomError("deltaforge", message)  # no context: braces in it are kept as they are


def _int(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"expected an integer >= {minimum}, got {value!r}")
        if value < minimum:
            fail(f"expected an integer >= {minimum}, got {value}")
        return value

    return check


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        fail(f"expected a positive number, got {value!r}")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        fail(f"expected true or false, got {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        fail(f"expected a non-empty string, got {value!r}")
    return value


def _names(what: str) -> Callable[[Any], list[str]]:
    def check(value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
            fail(f"expected a list of {what}, got {value!r}")
        return list(value)

    return check


def matching(pattern: str, expected: str) -> AfterValidator:
    """A string that must match ``pattern``; the error says ``expected`` (never echoes the value:
    it may hold a password)."""
    rx = re.compile(pattern)

    def check(value: str) -> str:
        if not rx.match(value):
            fail(expected)
        return value

    return AfterValidator(check)


def server_addresses(expected: str, several: bool = False, first_at: bool = False) -> AfterValidator:
    """A URL (``several``: comma-separated URLs, or a broker list) whose user, password, hosts and
    ports its driver reads as written (``configaddrs``; ``first_at`` as there); the error is
    ``expected`` and what is wrong, never the value."""

    def check(value: str) -> str:
        for url in value.split(",") if several else [value]:
            if (problem := url_problem(url.strip(), first_at)) is not None:
                fail(f"{expected}: {problem}")
        return value

    return AfterValidator(check)


NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_int(0)), Hint("an integer")]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_int(1)), Hint("an integer")]
PositiveNumber = Annotated[float, Field(gt=0), BeforeValidator(_positive), Hint("a number")]
Bool = Annotated[bool, BeforeValidator(_bool), Hint("true or false")]
Text = Annotated[str, Field(min_length=1), BeforeValidator(_text), Hint("a string")]
TableNames = Annotated[list[str], BeforeValidator(_names("table names")), Hint("a list of table names")]
Identifier = Annotated[
    str,
    Field(pattern=r"^[a-z_][a-z0-9_]*$"),
    BeforeValidator(_text),
    AfterValidator(
        lambda v: (
            v if re.match(r"^[a-z_][a-z0-9_]*$", v) else fail(f"expected a lower-case identifier, got {v!r}")
        )
    ),
    Hint("a lower-case identifier"),
]
Brokers = Annotated[Text, server_addresses("expected host:port[,host:port...]", several=True)]
"""Kafka's bootstrap servers."""
PostgresDsn = Annotated[
    str,
    BeforeValidator(_text),
    matching(r"^postgres(ql)?://", "expected postgresql://user:password@host:port/db"),
    server_addresses("expected postgresql://user:password@host:port/db", first_at=True),  # asyncpg
    Hint("a string"),
]


class PluginConfig(BaseModel):
    """A plug-in's settings: immutable, unknown keys refused, every field described."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False)


class Invalid(ValueError):
    """Validation failed; ``errors`` are ``path: problem`` strings, every one at once."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


def validate(model: type[M], raw: Any, path: str) -> M:
    """``raw`` as a ``model``, or :class:`Invalid` listing every problem with its path."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise Invalid([f"{path}: expected a mapping, got {type(raw).__name__}"])
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        raise Invalid([_describe(model, err, path) for err in exc.errors(include_url=False)]) from None


def _describe(model: type[BaseModel], err: Any, path: str) -> str:
    loc = tuple(err["loc"])
    where = path + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    kind, value = err["type"], err.get("input")
    if kind == "deltaforge":
        return f"{where}: {err['msg']}"
    if kind == "missing":
        info = _field(model, loc)
        hint = next((m.text for m in (info.metadata if info else []) if isinstance(m, Hint)), "a value")
        return f"{where}: required ({hint})"
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        allowed = sorted(parent.model_fields) if parent else []
        return f"{where}: unknown field; expected one of {', '.join(allowed)}"
    if kind == "literal_error":
        info = _field(model, loc)
        options = _literal_options(info.annotation if info else None)
        return f"{where}: expected one of {', '.join(options)}, got {_given(loc, value)}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{where}: expected a mapping, got {type(value).__name__}"
    return f"{where}: {err['msg'].lower()}, got {_given(loc, value)}"


def _given(loc: tuple[Any, ...], value: Any) -> str:
    """The value an error shows, unless its field holds a secret (a ``producer`` setting
    ``sasl.password``): then only its type."""
    if any(isinstance(part, str) and names_secret(part) for part in loc):
        return f"a {type(value).__name__} (not shown: a secret)"
    return repr(value)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = current.model_fields.get(part)
        if info is None:
            return None
        current = _model_in(info.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _field(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    names = [p for p in loc if not isinstance(p, int)]
    if not names:
        return None
    parent = _model_at(model, tuple(names[:-1]))
    return parent.model_fields.get(names[-1]) if parent else None


def _literal_options(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    for arg in typing.get_args(annotation):
        found = _literal_options(arg)
        if found:
            return found
    return []


ENVELOPES = ("native", "debezium", "cloudevents")


def _envelope(value: Any) -> str:
    name = value.get("type", "native") if isinstance(value, Mapping) else value
    if not isinstance(value, str | Mapping):
        fail(f"expected an envelope name or {{type: ...}}, got {value!r}")
    if name not in ENVELOPES:
        fail(f"expected one of {', '.join(ENVELOPES)}, got {name!r}")
    return str(name)


_ENVELOPE_NAME = {"enum": list(ENVELOPES)}
Envelope = Annotated[
    str,
    BeforeValidator(_envelope),
    WithJsonSchema(
        {
            "anyOf": [
                _ENVELOPE_NAME,
                {"type": "object", "properties": {"type": _ENVELOPE_NAME}, "additionalProperties": False},
            ],
            "description": "How each event is shaped: native, debezium or cloudevents (or {type: ...}).",
        }
    ),
]


class SourceSettings(PluginConfig):
    """What every source's model has."""

    id: Text = Field(description="Names this source in checkpoint keys, logs and metrics; keep it stable.")


class SnapshotSettings(PluginConfig):
    """``spec.source.config.snapshot``: copying the rows already in the tables (see docs/snapshots.md)."""

    mode: Literal["initial", "never", "always", "when_needed"] = Field(
        "never",
        description="initial: when the pipeline has no checkpoint yet; never: only on request; always: "
        "at every start; when_needed: initial, and again instead of halting when the position is lost.",
    )
    tables: TableNames | None = Field(None, description="Tables to snapshot (default: all captured).")
    chunk_size: PositiveInt = Field(10_000, description="Rows per chunk (one primary-key range).")
    max_parallel_tables: PositiveInt = Field(1, description="Tables whose chunks are read at the same time.")
    stream_lag_warning_s: PositiveNumber = Field(
        10.0,
        description="Warn (snapshot_stream_behind) when a window waits longer than this for its high "
        "watermark to come back through the stream: the stream reads behind what the database writes, "
        "and the snapshot goes only as fast as the stream.",
    )
    on_column_change: Literal["warn", "snapshot"] = Field(
        "warn",
        description="When a captured table gains a column or a column's type changes, rows already "
        "delivered may hold values the DDL changed without a change event (a default filling the new "
        "column, a conversion): warn (log columns_changed), or snapshot the table again.",
    )
    signal_table: Text | None = Field(
        None,
        description="MySQL/MariaDB: the table watermarks and signal rows are written to (created when "
        "missing; default: deltaforge_signal in the DSN's database). PostgreSQL: a Debezium-style "
        "signal table to watch (watermarks use pg_logical_emit_message).",
    )


class ServerSourceSettings(SourceSettings):
    """What a source reading a database server has: what to do when failover changed a schema."""

    snapshot: SnapshotSettings = Field(
        default_factory=SnapshotSettings, description="Snapshots of the rows already there."
    )

    on_schema_drift: Literal["adapt", "halt"] = Field(
        "adapt",
        description="After a failover, when the new server's tables differ from the schemas last "
        "recorded: adapt (record the drift, continue with the new schema) or halt.",
    )
    query_timeout_s: PositiveNumber = Field(
        60.0,
        description="How long one of deltaforge's own queries (a snapshot's chunk reads, the checks) "
        "may go unanswered before its connection is given up as dead and the server is unavailable: "
        "a server whose host vanished, or a connection a NAT forgot, answers nothing and closes nothing.",
    )


class SinkSettings(PluginConfig):
    """What every sink's model has."""

    id: Text = Field(description="Names this sink in checkpoint keys, logs and metrics; keep it stable.")
    required: Bool = Field(True, description="Whether the commit policy waits for this sink.")
    envelope: Envelope = Field("native", description="Event shape: native, debezium or cloudevents.")


S = TypeVar("S", bound=SourceSettings)
K = TypeVar("K", bound=SinkSettings)


@dataclass(frozen=True, slots=True)
class SourceConfig(Generic[S]):
    """``spec.source``: the source's type and its validated settings."""

    type: str
    config: S

    @property
    def id(self) -> str:
        return self.config.id


@dataclass(frozen=True, slots=True)
class SinkConfig(Generic[K]):
    """One ``spec.sinks`` entry: the sink's type and its validated settings."""

    type: str
    config: K

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def required(self) -> bool:
        return self.config.required

    @property
    def envelope(self) -> str:
        return self.config.envelope
