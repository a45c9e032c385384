"""One pipeline per source id in a checkpoint store.

Checkpoints, snapshot progress and schema history are kept by source id, and pipelines share
a store by default (``spec.storage.path``). A second pipeline whose source had the same id would
take the first one's checkpoints for its own: a position on another server, read past or read
again. The first pipeline to start under an id keeps it (``<source>::pipeline``).
"""

from __future__ import annotations

import asyncio
import os

from deltaforge.config import PipelineConfig
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.state.checkpoints import CheckpointStore

_CLAIMS: dict[tuple[int, str], asyncio.Lock] = {}
"""One lock per event loop and store file (a lock belongs to the loop it first waited in)."""


def _claim_lock(store_path: str) -> asyncio.Lock:
    key = (id(asyncio.get_running_loop()), os.path.abspath(store_path))  # the cwd: no disk read
    return _CLAIMS.setdefault(key, asyncio.Lock())


def owner_key(source_id: str) -> str:
    """Where the store keeps the name of the pipeline whose source has this id."""
    return f"{source_id}::pipeline"


async def claim_source_id(
    store: CheckpointStore, source_id: str, config: PipelineConfig, writes: PatientWrites
) -> str | None:
    """Why ``config``'s pipeline cannot use ``store`` (None: it can, and now owns ``source_id``
    there). Claims in one process are made one at a time; a claim written at the same time by
    another process is read back (the last write wins)."""
    key = owner_key(source_id)
    # Pipelines of one serve start together, each on its own connection to the store: a look and
    # a write of theirs must not interleave, or two would each find the id free and take it.
    async with _claim_lock(config.storage.path):
        owner = await store.get(key)
        if owner is None:
            if renamed := await _renamed_from(store, source_id, config):
                return renamed
            await writes(lambda: store.put(key, {"name": config.name}))
            owner = await store.get(key)  # another process's claim at the same moment: the last wins
    name = owner.get("name") if owner is not None else None
    if name == config.name:
        return None
    storage = config.storage
    return (
        f"spec.source.config.id: source id {source_id!r} belongs to pipeline {name!r} in the {storage.type} "
        f"store {storage.path}, which keeps checkpoints by source id: this pipeline would read from that "
        f"one's; give this source another id, or this pipeline its own spec.storage.path (if this "
        f"pipeline was called {name!r} before, call it so again)"
    )


async def _renamed_from(store: CheckpointStore, source_id: str, config: PipelineConfig) -> str | None:
    """Why this pipeline cannot take ``source_id`` as its source's new id: its sinks hold
    checkpoints under the id it had (a rename in the config). Under the new id it would start as a
    new pipeline, from now (``snapshot.mode: never``) or from the beginning: what changed while
    it was stopped skipped, or sent again. Asked only at a first claim, so a whole listing is
    cheap enough."""
    held = await store.list_all()
    for key, (_, _, value) in held.items():
        old = key.removesuffix("::pipeline")
        if old in (key, source_id) or value.get("name") != config.name:
            continue
        sinks = sorted(k for k in held if k.startswith(f"{old}::sink::"))
        if not sinks:
            continue
        storage = config.storage
        return (
            f"spec.source.config.id: pipeline {config.name!r} has checkpoints under source id {old!r} in "
            f"the {storage.type} store {storage.path}, and its source's id is now {source_id!r}, which has "
            "none: started so, it would be a new pipeline, reading from now (snapshot.mode never) or from "
            "the beginning, and what changed while it was stopped would be skipped or sent again. If the "
            f"source is the same database, give it its id back ({old!r}); if it is another one, forget "
            f"the old checkpoints first: deltaforge checkpoints --storage-path {storage.path} --forget "
            + " ".join(sinks)
        )
    return None
