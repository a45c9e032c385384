"""The process settings ``serve`` and the decoder children start with keep a batch's freed heap
for the next batch, instead of giving it back to the kernel and faulting it in again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BATCHES = """
import resource, sys, orjson
from deltaforge import gctune
if sys.argv[1] == "tuned":
    gctune.tune()  # what serve and every decoder child run at start
docs = [{"id": i, "v": i, "payload": "x" * 40} for i in range(10_000)]
def batch():
    return [orjson.dumps(d) for d in docs]  # a batch's encoded events, kept until it is sent
kept = batch()
del kept
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
kept = batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_of_second_batch(mode: str, cwd: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, cwd=cwd, check=True
    )
    return int(out.stdout)


def test_a_batch_reuses_the_pages_the_batch_before_it_freed(tmp_path: Path) -> None:
    default = _faults_of_second_batch("default", tmp_path)
    tuned = _faults_of_second_batch("tuned", tmp_path)
    # The premise: with glibc's defaults the second batch faults its heap back in, a page per
    # kept document.
    assert default > 5_000, default
    assert tuned < default / 10, (tuned, default)
