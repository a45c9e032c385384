"""``spec.source.config`` of a Turso source."""

from __future__ import annotations

from pydantic import Field

from deltaforge.configmodel import (
    Bool,
    NonNegativeInt,
    PluginConfig,
    PositiveInt,
    PositiveNumber,
    SnapshotSettings,
    SourceSettings,
    TableNames,
    Text,
)


class DemoWorkloadConfig(PluginConfig):
    """The built-in demo writer (inserts and updates ``demo.orders`` in the source's database)."""

    enabled: Bool = Field(True, description="Run the demo writer inside the service.")
    rows_per_second: PositiveNumber = Field(20.0, description="How many changes a second it writes.")
    max_rows: NonNegativeInt = Field(0, description="Stop after this many rows (0: never).")


class TursoSourceConfig(SourceSettings):
    """An embedded Turso database file, read through its ``turso_cdc`` table."""

    path: Text = Field(description="The database file (the writing application must run in-process).")
    tables: TableNames | None = Field(None, description="Tables to capture (default: all).")
    poll_interval_ms: PositiveInt = Field(50, description="Wait after a read that found nothing new.")
    read_chunk: PositiveInt = Field(2000, description="Changes read per query.")
    workload: DemoWorkloadConfig | None = Field(None, description="The demo writer (the default pipeline's).")
    snapshot: SnapshotSettings = Field(
        default_factory=SnapshotSettings, description="Snapshots of the rows already there."
    )
