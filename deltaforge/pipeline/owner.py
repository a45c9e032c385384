"""One pipeline per source id in a checkpoint store.

Checkpoints, snapshot progress and schema history are kept by source id, and pipelines share
a store by default (``spec.storage.path``). A second pipeline whose source had the same id would
take the first one's checkpoints for its own: a position on another server, read past or read
again. The first pipeline to start under an id keeps it (``<source>::pipeline``).
"""

from __future__ import annotations

from deltaforge.config import PipelineConfig
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.state.checkpoints import CheckpointStore


def owner_key(source_id: str) -> str:
    """Where the store keeps the name of the pipeline whose source has this id."""
    return f"{source_id}::pipeline"


async def claim_source_id(
    store: CheckpointStore, source_id: str, config: PipelineConfig, writes: PatientWrites
) -> str | None:
    """Why ``config``'s pipeline cannot use ``store`` (None: it can, and now owns ``source_id``
    there). A claim written at the same time as another pipeline's is read back: the last write
    wins, and exactly one of the two goes on."""
    key = owner_key(source_id)
    owner = await store.get(key)
    if owner is None:
        await writes(lambda: store.put(key, {"name": config.name}))
        owner = await store.get(key)
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
