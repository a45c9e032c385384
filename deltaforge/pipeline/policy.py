"""The commit policy (``spec.commit_policy``): which sinks must take a batch before the
checkpoints move. ``required`` sinks hold the pipeline back; the others may lag and catch up
from their own checkpoints (``coordinator.py``)."""

from __future__ import annotations

from deltaforge.sections import CommitPolicy


def needed(policy: CommitPolicy, required: bool) -> bool:
    """Whether a sink (``required`` as configured) must take every batch for checkpoints to move:
    a sink that is not may lag, and catches up later from its own checkpoint."""
    if policy.mode == "all":
        return True
    if policy.mode == "quorum":
        return False
    return required


def policy_satisfied(policy: CommitPolicy, required: dict[str, bool], acked: set[str]) -> bool:
    """Whether ``acked`` sinks are enough to commit under ``policy``."""
    if policy.mode == "all":
        return all(s in acked for s in required)
    if policy.mode == "quorum":
        return len(acked) >= policy.quorum
    return all(s in acked for s, req in required.items() if req)
