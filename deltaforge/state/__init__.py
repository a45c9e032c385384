"""Durable state: checkpoints (and later server identity, schemas, the DLQ)."""

from deltaforge.state.checkpoints import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    SqliteCheckpointStore,
    VersionInfo,
    open_store,
    sink_key,
)

__all__ = [
    "CheckpointStore",
    "FileCheckpointStore",
    "MemoryCheckpointStore",
    "SqliteCheckpointStore",
    "VersionInfo",
    "open_store",
    "sink_key",
]
