"""Dead letters delivered again, sink by sink in the order they were kept (``POST
/pipelines/{name}/dead-letters/replay``): each entry is acked (gone) only once its sink holds it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors import ActorRef, ActorStopped
from deltaforge.pipeline.dlq import DeadLetterQueue
from deltaforge.pipeline.messages import ReplayDeadLetters
from deltaforge.state.deadletters import Select

if TYPE_CHECKING:
    from deltaforge.pipeline.delivery import DeliveryWorker


class ReplayFailed(Exception):
    """Dead letters could not be delivered again (the entries stay)."""


async def replay(dlq: DeadLetterQueue, workers: dict[str, ActorRef[DeliveryWorker]], which: Select) -> int:
    """Deliver the chosen entries again through their sinks' workers; how many were. Raises
    :class:`ReplayFailed` saying why when a sink refuses (what it took before is acked)."""
    total = 0
    for sink, items in (await dlq.take_for_replay(which)).items():
        worker = workers.get(sink)
        if sink.startswith("source:"):
            raise ReplayFailed(
                f"{len(items)} record(s) the source could not read ({sink}): there is nothing to deliver "
                "again; ack them once the producer is fixed"
            )
        if worker is None:
            raise ReplayFailed(f"sink {sink!r} is not in this pipeline any more")
        try:
            why = await worker.ask(ReplayDeadLetters(tuple(e for _, e in items)), timeout=120)
        except (ActorStopped, TimeoutError) as exc:
            raise ReplayFailed(f"sink {sink!r}: the pipeline is not running ({type(exc).__name__})") from None
        if why is not None:
            raise ReplayFailed(f"sink {sink!r}: {why}")
        await dlq.remove(Select(seqs=tuple(seq for seq, _ in items)))
        dlq.replayed += len(items)
        total += len(items)
    return total
