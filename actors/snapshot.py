"""A point-in-time view of a node in a supervision tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """What an operator wants to see about one actor or supervisor."""

    name: str
    kind: str
    state: str
    restarts: int = 0
    last_error: str | None = None
    mailbox_depth: int | None = None
    mailbox_capacity: int | None = None
    children: tuple[NodeSnapshot, ...] = field(default_factory=tuple)
    restart_reasons: tuple[tuple[str, int], ...] = ()
    """Restarts by why: the exception's type, ``unavailable``, ``exit``, or ``group`` (a sibling failed)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (children nested)."""
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }
        if self.mailbox_capacity is not None:
            out["mailbox"] = {"depth": self.mailbox_depth, "capacity": self.mailbox_capacity}
        if self.children:
            out["children"] = [c.to_dict() for c in self.children]
        return out

    def find(self, name: str) -> NodeSnapshot | None:
        """The first node called ``name`` in this subtree, depth first."""
        if self.name == name:
            return self
        for child in self.children:
            hit = child.find(name)
            if hit is not None:
                return hit
        return None
