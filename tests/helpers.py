"""Small test helpers: waiting on conditions instead of sleeping and hoping."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import resource
import select
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import orjson

from actors.snapshot import NodeSnapshot
from deltaforge.events import Event
from deltaforge.sources.base import Source

T = TypeVar("T", bound=Hashable)


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``cond`` on the event loop until true; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(0.005)


def wait_until_sync(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a sink file ([] while it does not exist).

    A last line without its newline is still being written (or was torn by a SIGKILL, and the
    next start truncates it): it is not a delivered event yet, so it is left out.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete = lines[:-1]  # whatever follows the last newline is incomplete
    return [orjson.loads(x) for x in complete if x.strip()]


def first_occurrences(items: list[T]) -> list[T]:
    """``items`` with repeats (replays) removed, keeping the first time each was seen."""
    seen: set[T] = set()
    out: list[T] = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def stored_checkpoint(cp_db: Path, key: str) -> dict[str, Any] | None:
    """A checkpoint read straight from a SQLite store that a serve process is writing."""
    if not cp_db.exists():
        return None
    con = sqlite3.connect(cp_db)
    try:
        row = con.execute("SELECT value FROM checkpoints WHERE key = ?", (key,)).fetchone()
    except sqlite3.OperationalError:
        return None  # the schema is not there yet
    finally:
        con.close()
    return orjson.loads(row[0]) if row else None


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Screen:
    """What a process on a pseudo-terminal (``leader``, its other end) has drawn so far, escape
    sequences removed."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.text = ""

    def read(self) -> str:
        """Take in whatever is waiting, without blocking."""
        while select.select([self.leader], [], [], 0)[0]:
            try:
                self.text += ANSI.sub("", os.read(self.leader, 65536).decode(errors="replace"))
            except OSError:
                break
        return self.text


def on_terminal(
    args: list[str], cwd: Path | None = None, lines: int = 40
) -> tuple[subprocess.Popen[bytes], Screen]:
    """``args`` run on a pseudo-terminal 120 columns wide, and the screen it draws on."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        args, stdin=follower, stdout=follower, stderr=follower, close_fds=True, cwd=cwd,
        env={**os.environ, "COLUMNS": "120", "LINES": str(lines), "TERM": "xterm"},
    )  # fmt: skip
    os.close(follower)
    return proc, Screen(leader)


def offsets_in_order(records: list[dict[str, Any]], partition: int) -> list[int]:
    """The offsets of ``partition``'s records (``{"partition", "offset"}`` each: a raw Kafka
    source's row), each at its first arrival, in arrival order: sorted when order was kept."""
    firsts, seen = [], set()
    for r in records:
        if r["partition"] == partition and r["offset"] not in seen:
            seen.add(r["offset"])
            firsts.append(r["offset"])
    return firsts


def next_offsets(records: list[dict[str, Any]], partitions: int) -> dict[int, int]:
    """Per partition, the offset after the longest run from 0 that ``records`` hold: what a group
    may have committed, at most."""
    have: dict[int, set[int]] = {p: set() for p in range(partitions)}
    for r in records:
        have[r["partition"]].add(r["offset"])
    out = {}
    for p, offsets in have.items():
        o = 0
        while o in offsets:
            o += 1
        out[p] = o
    return out


def damage_on_disk(path: Path, text: bytes) -> None:
    """Change the last copy of ``text`` in the file ``path`` (its case swapped, same length): a
    server's log damaged on disk. The last copy: MariaDB's binlog holds a statement's text in its
    annotation before the rows event, PostgreSQL's WAL may hold a page image before the record."""
    raw = path.read_bytes()
    at = raw.rindex(text)
    path.write_bytes(raw[:at] + text.swapcase() + raw[at + len(text) :])


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """This process may not write files past ``size`` bytes: the kernel refuses such writes (EFBIG),
    as a full disk refuses them (ENOSPC). The soft RLIMIT_FSIZE, put back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def restarts(node: NodeSnapshot) -> int:
    """How many times any actor of a supervisor tree (``runner.snapshot()``) was restarted."""
    return node.restarts + sum(restarts(child) for child in node.children)


async def one_transaction_in_pieces(src: Source, rows: int, then: int, timeout: float = 60) -> list[Event]:
    """The events of a ``rows``-event transaction read from ``src``, and the ``then`` events after
    it. The first read must hand over part of it, ending nothing (it was not held to its commit),
    and its events must still make one transaction: one id, in order, one end, at its end."""
    deadline = time.monotonic() + timeout
    out: list[Event] = []
    while len(out) < rows + then:
        assert time.monotonic() < deadline, f"read {len(out)} of {rows + then}"
        got = [e for e in await src.read() if e.op != "h"]
        if got and not out:
            assert len(got) < rows and not any(e.tx_end for e in got), "the first read ends the transaction"
        out += got
    big = out[:rows]
    assert len({e.tx_id for e in big}) == 1 and [e.tx_end for e in big].count(True) == 1 and big[-1].tx_end
    assert [e.order for e in big] == sorted(e.order for e in big)
    return out


def a_cancelled_wait_lets_the_process_exit(setup: str, awaited: str) -> None:
    """A Python process runs ``setup`` (statements), then in a coroutine starts ``awaited`` (an
    expression naming an async callable), cancels it once it waits, returns, and must exit: the
    interpreter joins non-daemon threads at exit, so one the cancelled wait left behind on a
    blocking call would hold the process for the rest of that call. Timed out after 60 s."""
    script = (
        f"import anyio\n{setup}\n"
        "async def main():\n"
        f"    wait = {awaited}\n"
        "    async with anyio.create_task_group() as tg:\n"
        "        tg.start_soon(wait)\n"
        "        await anyio.wait_all_tasks_blocked()\n"
        "        tg.cancel_scope.cancel()\n"
        "anyio.run(main)\n"
        "print('returned', flush=True)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert (done.returncode, done.stdout) == (0, "returned\n"), done.stderr


def librdkafka_clients(pid: int) -> int:
    """librdkafka clients alive in process ``pid``: each runs one thread named ``rdk:main``."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue  # ended meanwhile
    return names.count("rdk:main")
