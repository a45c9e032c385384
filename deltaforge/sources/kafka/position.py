"""Where a Kafka reader stands: the next offset of every partition it has read."""

from __future__ import annotations

from typing import NamedTuple

from deltaforge.position import PositionDoc

Offset = tuple[str, int, int]
"""``(topic, partition, offset)``."""


class KafkaPosition(NamedTuple):
    """``offsets``: ``(topic, partition, next offset)`` for each partition read, sorted; ``at``: the
    record this position is right after (None for a position loaded from a checkpoint).

    Partitions are independent: a :class:`~deltaforge.position.PartitionedPosition`. A partition
    missing from ``offsets`` has nothing held (reading starts there from the group's committed
    offset, or from ``start``).

        >>> a = KafkaPosition((("t", 0, 5), ("t", 1, 2)))
        >>> b = KafkaPosition((("t", 0, 3), ("t", 1, 9), ("t", 2, 1)), at=("t", 1, 8))
        >>> a.join(b).offsets, a.meet(b).offsets, a.holds(b), b.holds(b)
        ((('t', 0, 5), ('t', 1, 9), ('t', 2, 1)), (('t', 0, 3), ('t', 1, 2)), False, True)
    """

    offsets: tuple[Offset, ...]
    at: Offset | None = None

    @property
    def order(self) -> tuple[int, ...]:
        # Within one reading every partition only grows, so the offsets in a fixed partition order
        # sort positions; comparisons across a resume go through join/meet/holds instead.
        return tuple(o for _, _, o in self.offsets)

    def to_doc(self) -> PositionDoc:
        return {"offsets": [[t, p, o] for t, p, o in self.offsets]}

    @classmethod
    def from_doc(cls, doc: PositionDoc) -> KafkaPosition:
        raw = doc.get("offsets")
        if not isinstance(raw, list):
            raise ValueError(f"checkpoint field 'offsets' is not a list: {raw!r}")
        out: list[Offset] = []
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in item[1:])):  # fmt: skip
                raise ValueError(f"checkpoint offset is not [topic, partition, offset]: {item!r}")
            out.append((item[0], int(item[1]), int(item[2])))  # type: ignore[arg-type]
        return cls(tuple(sorted(out)))

    def next_offsets(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.offsets}

    def join(self, other: KafkaPosition) -> KafkaPosition:
        mine = self.next_offsets()
        changed = False
        for t, p, o in other.offsets:
            if mine.get((t, p), -1) < o:
                mine[(t, p)] = o
                changed = True
        if not changed:
            return self
        return KafkaPosition(tuple(sorted((t, p, o) for (t, p), o in mine.items())), other.at)

    def meet(self, other: KafkaPosition) -> KafkaPosition:
        theirs = other.next_offsets()
        both = tuple((t, p, min(o, theirs[(t, p)])) for t, p, o in self.offsets if (t, p) in theirs)
        return self if both == self.offsets else KafkaPosition(both)

    def lane(self) -> tuple[str, tuple[int, ...]] | None:
        if self.at is None:
            return None
        t, p, o = self.at
        return f"{t}:{p}", (o,)

    def holds(self, checkpoint: KafkaPosition) -> bool:
        if checkpoint.at is None:  # a whole position: held when every partition of it is
            mine = self.next_offsets()
            return all(mine.get((t, p), -1) >= o for t, p, o in checkpoint.offsets)
        t, p, o = checkpoint.at
        for t2, p2, o2 in self.offsets:
            if t2 == t and p2 == p:
                return o < o2
        return False
