"""A decoder child stopped mid-stream through ``serve`` (SIGSTOP, as a cgroup freezer does): the
same proof for each source that has one (``childproc.ChildDecoder``'s alive frames)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import serve_pipeline


def stopped_decoder_is_replaced(
    tmp: Path, source: dict[str, Any], write: Callable[[int, int], None], bound_s: float
) -> None:
    """``serve`` from ``source`` to a file sink; ``write(first, last)`` commits rows with those
    ids. Rows 1-10 delivered, the decoder child is stopped, rows 11-20 written: they must
    arrive, the reader's restart naming the stopped child and its ``bound_s``."""
    out, log = tmp / "out.jsonl", tmp / "log.jsonl"
    spec = {"source": source, "sinks": [{"type": "file", "config": {"id": "f", "path": str(out)}}]}
    module = f"deltaforge.sources.{source['type']}.decoder"
    with serve_pipeline(tmp, spec) as serve:
        write(1, 10)
        wait_until_sync(lambda: len(jsonl(out)) == 10, timeout=30, what="the first rows")
        [child] = [p for p in psutil.Process(serve.proc.pid).children() if module in p.cmdline()]
        child.suspend()
        write(11, 20)
        wait_until_sync(
            lambda: len(jsonl(out)) >= 20, timeout=90, what="the rows written while it was stopped"
        )
        assert serve.terminate() == 0
    assert {r["after"]["id"] for r in jsonl(out)} == set(range(1, 21))
    said = [
        r["reason"] for r in jsonl(log) if r["event"] == "child_restarted" and r["failed"] == "SourceReader"
    ]
    assert any(f"decoder process {child.pid} said nothing for {bound_s:g} s" in r for r in said), said
