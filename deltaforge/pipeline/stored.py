"""What a pipeline keeps in its checkpoint store, as the API reads it (its sinks' checkpoints, its
tables' schema histories), and what deleting it with its checkpoints forgets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from deltaforge.pipeline.heldends import held_key
from deltaforge.pipeline.owner import owner_key
from deltaforge.pipeline.reconciler import identity_key
from deltaforge.pipeline.sinkids import sinks_key
from deltaforge.position import PositionDoc
from deltaforge.snapshot.listed import listed_key
from deltaforge.snapshot.progress import progress_key
from deltaforge.state.checkpoints import CheckpointStore, open_store, set_back_key, set_back_note, sink_key

if TYPE_CHECKING:
    from deltaforge.sections import StorageConfig

T = TypeVar("T")


class StoredCheckpoint(TypedDict):
    """One sink's checkpoint as the API shows it."""

    key: str
    version: int
    updated_at: float
    position: PositionDoc


async def checkpoints(
    store: CheckpointStore, source_id: str, sinks: list[str]
) -> dict[str, StoredCheckpoint | None]:
    """Each sink's current checkpoint with its version (None: it has none)."""
    keys = {sink_key(source_id, sid): sid for sid in sinks}
    listed = await store.list_all()
    return {
        sid: {"key": key, "version": listed[key][0], "updated_at": listed[key][1], "position": listed[key][2]}
        if key in listed
        else None
        for key, sid in keys.items()
    }


async def latest_schemas(store: CheckpointStore, source_id: str) -> dict[str, Any]:
    """Each captured table's current schema: its latest recorded version."""
    tables: dict[str, Any] = {}
    for table in await store.schema_tables(source_id):
        history = await store.schema_history(source_id, table)
        tables[table] = {"version": len(history), **history[-1]}
    return tables


async def schema_versions(store: CheckpointStore, source_id: str, table: str) -> list[dict[str, Any]]:
    """Every schema recorded for ``table``, oldest first, each from the source position it began at."""
    history = await store.schema_history(source_id, table)
    return [{"version": n, **doc} for n, doc in enumerate(history, 1)]


async def forget(store: CheckpointStore, source_id: str, sinks: list[str]) -> None:
    """Delete a pipeline's checkpoints (and the source's failover identity and snapshot progress,
    with the stream position a snapshot began at): a pipeline created again under its name starts
    from the beginning, and its sinks' own records of what they hold (a Kafka ``exactly_once``
    position record, a Redis watermark) are set back when it starts."""
    keys = [sink_key(source_id, sid) for sid in sinks] + [identity_key(source_id), progress_key(source_id)]
    keys += [owner_key(source_id), listed_key(source_id), sinks_key(source_id)]
    keys += [held_key(source_id, sid) for sid in sinks]
    await store.delete_keys(keys)
    await store.put_many({set_back_key(source_id, sid): set_back_note("deleted") for sid in sinks})


async def read_on(
    store: CheckpointStore, storage: StorageConfig | None, work: Callable[[CheckpointStore], Awaitable[T]]
) -> T:
    """``work`` on the live ``store`` or, once the pipeline has stopped and closed it (a halt is
    when its records matter most), on a short-lived one over the same ``storage`` (None: the
    store is the caller's, not opened again)."""
    try:
        return await work(store)
    except RuntimeError:  # not open
        if storage is None:
            raise
    again = open_store(storage.type, storage.path)
    await again.open()
    try:
        return await work(again)
    finally:
        await again.close()
