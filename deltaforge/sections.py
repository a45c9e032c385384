"""The sections of a pipeline's spec that belong to no plug-in: ``metadata``, ``batch``,
``commit_policy``, ``supervision``, ``storage`` and ``journal`` (read by ``config.py``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from deltaforge.configmodel import Bool, NonNegativeInt, PluginConfig, PositiveInt, PositiveNumber, Text, fail


def _path_segment(name: str) -> str:
    """A name the REST API can be asked about (``/pipelines/{name}``): a ``/``, even encoded, is
    read as the path's own, and a control character cannot be sent in a request line."""
    if "/" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        fail(
            f"expected a name without '/' or control characters (it is a path segment of the REST API), got {name!r}"
        )
    return name


PipelineName = Annotated[Text, AfterValidator(_path_segment)]


class Metadata(PluginConfig):
    """``metadata``: who this pipeline is."""

    name: PipelineName = Field(
        description="The pipeline's name: unique per service, used in logs, metrics and the API "
        "(a path segment there: no '/')."
    )
    tenant: Text | None = Field(
        None,
        description="Part of every event's idempotency key, and the envelope's source name (default: name).",
    )


class BatchConfig(PluginConfig):
    """``spec.batch``: how the event stream is cut into batches."""

    max_events: PositiveInt = Field(2000, description="Cut a batch at this many events.")
    max_bytes: PositiveInt = Field(16 * 1024 * 1024, description="Cut a batch at about this many bytes.")
    max_ms: PositiveInt = Field(50, description="Cut a partial batch this old.")
    respect_source_tx: Bool = Field(True, description="Cut only at source transaction ends.")
    max_tx_events: PositiveInt = Field(
        50_000,
        description="With respect_source_tx, a transaction with more events than this is cut at the "
        "limits like any stream (logged transaction_split), so memory stays bounded.",
    )
    max_inflight: PositiveInt = Field(1, description="Batches delivered or transformed at once.")


class CommitPolicy(PluginConfig):
    """``spec.commit_policy``: which sinks must have a batch before checkpoints move."""

    mode: Literal["required", "all", "quorum"] = Field(
        "required", description="required: every required sink; all: every sink; quorum: any N sinks."
    )
    quorum: NonNegativeInt = Field(0, description="N, with mode quorum.")


class BackoffConfig(PluginConfig):
    """``spec.supervision.backoff``: the wait before a restart, doubling per recent restart."""

    base_ms: NonNegativeInt = Field(100, description="The first wait.")
    max_ms: NonNegativeInt = Field(10_000, description="The longest wait.")


class SupervisionConfig(PluginConfig):
    """``spec.supervision``: the pipeline supervisor's restart policy (see pipeline/tree.py)."""

    # one_for_one is not offered at the pipeline level: see pipeline/tree.py for why.
    strategy: Literal["one_for_all", "rest_for_one"] = Field(
        "one_for_all", description="Restart everything, or the failed actor and those after it."
    )
    max_restarts: NonNegativeInt = Field(5, description="More restarts than this ...")
    within_seconds: PositiveNumber = Field(
        60.0, description="... within this many seconds fail the pipeline."
    )
    backoff: BackoffConfig = Field(default_factory=BackoffConfig, description="Wait before a restart.")
    max_unavailable_s: PositiveNumber | None = Field(
        None, description="Fail the pipeline once its source has been down this long (default: wait forever)."
    )

    @property
    def backoff_base_ms(self) -> int:
        return self.backoff.base_ms

    @property
    def backoff_max_ms(self) -> int:
        return self.backoff.max_ms


class StorageConfig(PluginConfig):
    """``spec.storage``: where checkpoints are kept."""

    type: Literal["sqlite", "file", "memory"] = Field(
        "sqlite", description="sqlite (versioned), file (JSON) or memory."
    )
    path: Text = Field("./data/deltaforge.db", description="The store's file.")


class DlqConfig(PluginConfig):
    """``spec.journal.dlq``: how many dead letters are kept, and what happens when it is full."""

    max_entries: PositiveInt = Field(10_000, description="Most entries kept.")
    max_age_secs: PositiveInt = Field(7 * 24 * 3600, description="Entries older than this are dropped.")
    overflow_policy: Literal["drop_oldest", "reject", "block"] = Field(
        "drop_oldest",
        description="Full: drop the oldest entry, reject (drop) the new one, or block the sink until "
        "an operator acks or purges.",
    )


class JournalConfig(PluginConfig):
    """``spec.journal``: the dead-letter queue for poison events (off: a poison event halts)."""

    enabled: Bool = Field(False, description="Send poison events to the DLQ instead of halting.")
    max_event_bytes: PositiveInt = Field(
        256 * 1024, description="An event larger than this is kept truncated (and cannot be replayed)."
    )
    dlq: DlqConfig = Field(default_factory=DlqConfig, description="The dead-letter queue's bounds.")
