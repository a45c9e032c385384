"""What each sink id stood for when its checkpoint was made: the sink's type and where it writes.

A sink's checkpoint is kept under its id. A sink given another type or destination under the
same id (a file sink made a Kafka sink; another topic, file or server) starts from the old one's
checkpoint, and its new destination lacks everything before it. The sinks of the last start are
kept in the store (``<source>::sinks``). A type changed under a checkpoint is refused at start:
no two types write the same place. A destination changed is said (``sink_destination_changed``),
not refused: moving a destination along with its data (a topic mirrored to a new cluster, a file
moved) is what such a change often is.

Destinations are kept without credentials: a URL's user and password, and a DSN's query, are
left out (a password changed is no new destination).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from deltaforge.config import PipelineConfig
from deltaforge.configmodel import SinkConfig, SourceConfig
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.state.checkpoints import CheckpointStore

_WHERE: dict[str, tuple[str, ...]] = {
    "file": ("path",),
    "kafka": ("brokers", "topic"),
    "redis": ("uri", "stream"),
    "nats": ("url", "stream", "subject"),
    "postgres": ("dsn", "table"),
}
"""The settings that say where a sink of each type writes (any other type: its type alone)."""


def deployment_of(source: SourceConfig[Any]) -> str:
    """Which deployment of a pipeline this is, as a sink server may need to tell (a Redis stream's
    ``exactly_once`` watermark): where its source reads, hashed (8 hex digits). One config
    deployed once per shard runs one pipeline name against several servers; the same pipeline
    on the same server, with its store lost or in memory, or a standby taking over, is the same
    deployment, so its replays are still recognised. Credentials are left out."""
    cfg = source.config
    if (dsn := getattr(cfg, "dsn", None)) is not None:
        where = _server(str(dsn))
    elif (brokers := getattr(cfg, "brokers", None)) is not None:
        where = ",".join(sorted(b.strip().lower() for b in str(brokers).split(",")))
    elif (path := getattr(cfg, "path", None)) is not None:
        where = str(Path(path).absolute())
    else:
        where = source.id
    return f"{zlib.crc32(f'{source.type} {where}'.encode()):08x}"


def sinks_key(source_id: str) -> str:
    return f"{source_id}::sinks"


def _server(url: str) -> str:
    """A URL without its user, password and query; anything else (a key=value DSN) by its host,
    port and database."""
    if "://" in url:  # one URL, or several (NATS servers), each with its own credentials
        parts = [urlsplit(u.strip()) for u in url.split(",")]
        return ",".join(f"{p.scheme}://{p.netloc.rpartition('@')[2]}{p.path}" for p in parts)
    words = dict(w.split("=", 1) for w in url.split() if "=" in w)
    return " ".join(f"{k}={words[k]}" for k in ("host", "port", "dbname") if k in words)


def destination(sink: SinkConfig[Any]) -> str:
    """The sink's type and where it writes, e.g. ``file /data/events.jsonl``."""
    parts = [sink.type]
    for name in _WHERE.get(sink.type, ()):
        value = getattr(sink.config, name, None)
        if value is None:
            continue
        if name == "path":
            value = str(Path(value).absolute())  # another working folder: another file
        elif name in ("uri", "url", "dsn"):
            value = _server(str(value))
        parts.append(str(value))
    return " ".join(parts)


async def check_sinks(
    store: CheckpointStore,
    config: PipelineConfig,
    key_of: Callable[[str], str],
    writes: PatientWrites,
    log: structlog.stdlib.BoundLogger,
) -> str | None:
    """Why the pipeline cannot start with its sinks (None: it can): a sink whose type changed
    under its checkpoint. A destination changed is logged. The sinks as they are now are stored
    (once nothing is refused). ``key_of``: a sink id's checkpoint key."""
    key = sinks_key(config.source.id)
    stored = await store.get(key)
    found = stored.get("sinks") if stored is not None else None
    before: dict[str, Any] = found if isinstance(found, dict) else {}
    now = {s.id: destination(s) for s in config.sinks}
    changed = [(i, s) for i, s in enumerate(config.sinks) if before.get(s.id) not in (None, now[s.id])]
    held = await store.get_many([key_of(s.id) for _, s in changed]) if changed else {}
    storage = config.storage
    for i, sink in changed:
        if (checkpoint := key_of(sink.id)) not in held:
            continue  # nothing delivered under the id: nothing to lack
        was, forget = (
            str(before[sink.id]),
            f"deltaforge checkpoints --storage-path {storage.path} --forget {checkpoint}",
        )
        if was.split(" ", 1)[0] != sink.type:
            return (
                f"spec.sinks[{i}]: sink {sink.id!r} holds the checkpoint of a {was.split(' ', 1)[0]} sink ({was}), "
                f"and is now a {sink.type} sink ({now[sink.id]}): it would start from that checkpoint, and its "
                "destination would lack everything before it. Give the sink another id (a sink added: see "
                f"snapshot.mode), or forget the checkpoint: {forget}"
            )
        log.warning(
            "sink_destination_changed", sink=sink.id, was=was, now=now[sink.id],
            reason="the sink starts from the checkpoint made for its old destination, so the new one lacks "
            "what came before, unless it was moved there with its data; if not, stop the pipeline and forget "
            f"the checkpoint ({forget}): the sink is then a sink added",
        )  # fmt: skip
    # Sinks taken out stay: put back under another type, they are compared too.
    if (kept := {**before, **now}) != before:
        await writes(lambda: store.put(key, {"sinks": kept}))
    return None
