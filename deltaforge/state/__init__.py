"""Durable state: checkpoints (and later server identity, schemas, the DLQ)."""

from deltaforge.state.checkpoints import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    VersionInfo,
    open_store,
    sink_key,
)
from deltaforge.state.sqlite_store import SqliteCheckpointStore

__all__ = [
    "CheckpointStore",
    "FileCheckpointStore",
    "MemoryCheckpointStore",
    "SqliteCheckpointStore",
    "VersionInfo",
    "open_store",
    "sink_key",
]
