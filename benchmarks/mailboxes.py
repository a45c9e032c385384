"""Messages per second through a chain of three actors, chunked vs single.

    python benchmarks/mailboxes.py [--events 300000] [--chunk 500]

Prints one line per mode. Chunked mode moves lists of ``--chunk`` items per
message; per-item throughput is what a pipeline gets from each shape.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from actors import Actor, ActorCell, ActorRef, message


@message
class Items:
    items: list[int]


@message
class Item:
    value: int


class Relay(Actor):
    mailbox_size = 64

    def __init__(self, downstream: ActorRef | None, done: asyncio.Event, total: int) -> None:
        super().__init__()
        self.downstream = downstream
        self.done = done
        self.total = total
        self.seen = 0

    async def receive(self, message: Any) -> Any:
        if self.downstream is not None:
            await self.downstream.tell(message)
            return None
        self.seen += len(message.items) if isinstance(message, Items) else 1
        if self.seen >= self.total:
            self.done.set()
        return None


async def run_chain(total: int, chunk: int | None) -> float:
    done = asyncio.Event()
    sink = ActorCell("c", lambda: Relay(None, done, total))
    mid = ActorCell("b", lambda: Relay(sink.ref, done, total))
    head = ActorCell("a", lambda: Relay(mid.ref, done, total))
    tasks = [asyncio.create_task(c.run()) for c in (sink, mid, head)]
    start = time.perf_counter()
    if chunk:
        for base in range(0, total, chunk):
            await head.ref.tell(Items(list(range(base, min(base + chunk, total)))))
    else:
        for i in range(total):
            await head.ref.tell(Item(i))
    await done.wait()
    elapsed = time.perf_counter() - start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return total / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--chunk", type=int, default=500)
    args = ap.parse_args()
    single = asyncio.run(run_chain(args.events, None))
    chunked = asyncio.run(run_chain(args.events, args.chunk))
    print(f"3-actor chain, single messages : {single:>12,.0f} items/s")
    print(f"3-actor chain, chunks of {args.chunk:<6}: {chunked:>12,.0f} items/s ({chunked / single:.0f}x)")


if __name__ == "__main__":
    main()
