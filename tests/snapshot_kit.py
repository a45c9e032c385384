"""The handoff proof shared by the PostgreSQL and MariaDB snapshot tests.

A table ``items(id, v, payload)`` gets ``rows`` rows; a :class:`Writer` then inserts, updates,
deletes and moves primary keys of random rows for as long as the snapshot runs. ``v`` is a
global counter every write takes a new value of, so it orders a key's versions: the replay of
the sink must equal the table, and (without crashes) a key's events must arrive in ``v`` order
— a snapshot row delivered after a newer change of its key would break it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import Serve, serve_pipeline
from tests.servers.proxy import TcpProxy

Execute = Callable[[str, tuple[Any, ...]], None]


class Writer(threading.Thread):
    """Random writes on ``items`` through ``connect()``'s ``execute`` (autocommit), one at a time,
    ``rate`` a second: a busy application, not one that takes every CPU cycle the pipeline needs
    (then no stream keeps up, and every snapshot chunk waits for a lag that only grows)."""

    def __init__(
        self,
        connect: Callable[[], tuple[Execute, Callable[[], None]]],
        rows: int,
        seed: int,
        rate: float = 1500,
    ) -> None:
        super().__init__(daemon=True)
        self.connect = connect
        self.live = list(range(1, rows + 1))
        self.next_id = rows + 1
        self.v = rows  # the initial rows have v = id
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.ops: dict[str, int] = {"insert": 0, "update": 0, "delete": 0, "move": 0}
        self.error: BaseException | None = None
        self.rate = rate

    def run(self) -> None:
        try:
            execute, close = self.connect()
            try:
                started, done = time.monotonic(), 0
                while not self.stop.is_set():
                    self._one(execute)
                    done += 1
                    ahead = started + done / self.rate - time.monotonic()
                    if ahead > 0:
                        self.stop.wait(ahead)  # pacing the workload, not waiting for anything
            finally:
                close()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def _one(self, execute: Execute) -> None:
        self.v += 1
        v, rng, live = self.v, self.rng, self.live
        pick = rng.random()
        if pick < 0.2 or len(live) < 10:
            rid, self.next_id = self.next_id, self.next_id + 1
            execute("INSERT INTO items (id, v, payload) VALUES (%s, %s, 'new')", (rid, v))
            live.append(rid)
            self.ops["insert"] += 1
            return
        i = rng.randrange(len(live))
        rid = live[i]
        if pick < 0.7:
            execute("UPDATE items SET v = %s WHERE id = %s", (v, rid))
            self.ops["update"] += 1
        elif pick < 0.85:
            execute("DELETE FROM items WHERE id = %s", (rid,))
            live[i] = live[-1]
            live.pop()
            self.ops["delete"] += 1
        else:  # a primary-key update: the row moves to a fresh key (possibly past the snapshot)
            new, self.next_id = self.next_id, self.next_id + 1
            execute("UPDATE items SET id = %s, v = %s WHERE id = %s", (new, v, rid))
            live[i] = new
            self.ops["move"] += 1


def key_events(lines: list[dict[str, Any]]) -> dict[int, list[tuple[str, float]]]:
    """Per key, ``(op, stamp)`` of its events in delivery order: a stamp orders a key's versions
    (``v``; a delete sorts just after the version it removed; the old key of a moved row is
    removed at the move's ``v``)."""
    out: dict[int, list[tuple[str, float]]] = {}
    for d in lines:
        op, before, after = d["op"], d["before"], d["after"]
        if op in ("c", "r"):
            out.setdefault(int(after["id"]), []).append((op, float(after["v"])))
        elif op == "u":
            out.setdefault(int(after["id"]), []).append((op, float(after["v"])))
            if before is not None and int(before["id"]) != int(after["id"]):
                out.setdefault(int(before["id"]), []).append(("moved", float(after["v"])))
        elif op == "d":
            out.setdefault(int(before["id"]), []).append((op, float(before["v"]) + 0.5))
    return out


def replay(lines: list[dict[str, Any]]) -> dict[int, int]:
    """The table a sink's events build: id -> v."""
    table: dict[int, int] = {}
    for d in lines:
        op, before, after = d["op"], d["before"], d["after"]
        if op == "d":
            table.pop(int(before["id"]), None)
            continue
        if op == "u" and before is not None:
            table.pop(int(before["id"]), None)
        table[int(after["id"])] = int(after["v"])
    return table


def out_of_order(per_key: dict[int, list[tuple[str, float]]]) -> dict[int, list[tuple[str, float]]]:
    """Keys whose events do not arrive in version order."""
    return {k: evs for k, evs in per_key.items() if any(b[1] < a[1] for a, b in pairwise(evs))}


def last_not_newest(per_key: dict[int, list[tuple[str, float]]]) -> dict[int, list[tuple[str, float]]]:
    """Keys whose last delivered event is not their newest version (replays after a crash may
    repeat older events, but the last word must be the newest)."""
    return {k: evs for k, evs in per_key.items() if evs[-1][1] < max(s for _, s in evs)}


def check_handoff(sink: Path, table: dict[int, int], crashes: bool) -> int:
    """Assert the proof on the sink file; the number of snapshot rows delivered."""
    lines = jsonl(sink)
    got = replay(lines)
    missing = sorted(set(table) - set(got))[:10]
    extra = sorted(set(got) - set(table))[:10]
    stale = sorted(k for k in table if k in got and got[k] != table[k])[:10]
    assert got == table, f"replay differs: missing {missing}, extra {extra}, stale {stale}"
    per_key = key_events(lines)
    assert not last_not_newest(per_key), list(last_not_newest(per_key).items())[:5]
    if not crashes:
        bad = out_of_order(per_key)
        assert not bad, f"{len(bad)} keys out of order, e.g. {list(bad.items())[:3]}"
    return sum(1 for d in lines if d["op"] == "r")


def snapshot_status(serve: Serve, pipeline: str = "shop") -> dict[str, Any]:
    return dict(serve.get(f"/pipelines/{pipeline}").json()["snapshot"])


def snapshot_done(serve: Serve, pipeline: str = "shop") -> bool:
    """A snapshot has finished in this serve and none runs."""
    s = snapshot_status(serve, pipeline)
    return not s["running"] and bool(s["finished"])


def snapshot_rows_in(path: Path) -> int:
    """How many snapshot rows a sink file holds so far (cheap: no JSON parsing while polling)."""
    return path.read_bytes().count(b'"op":"r"') if path.exists() else 0


def frozen_mid_snapshot(
    tmp: Path, spec: dict[str, Any], rows: int, port: int, streams: Callable[[], set[int]], **config: Any
) -> None:
    """``serve`` on ``spec``, its source reached through a proxy in front of the server on
    ``port`` (``config`` added to the source's), until a tenth of ``rows`` is delivered; then
    every open connection to the source but the change stream's goes silent for good (the
    proxy's ``freeze``: its host vanished, or a NAT forgot them; new connections pass). The
    stream's own silence has its own rule and tests, and, frozen too, it spoke first whenever
    the snapshot was between two reads (waiting on a watermark); its connections' ports, as the
    server sees them, are ``streams()``. The snapshot must give the silent ones up after
    ``query_timeout_s`` (3 s here), saying so, and finish by itself."""
    log = tmp / "log.jsonl"
    source = spec["source"]["config"]
    with TcpProxy(port) as proxy:
        source.update(config, dsn=source["dsn"].replace(f":{port}/", f":{proxy.port}/"), query_timeout_s=3)
        with serve_pipeline(tmp, spec) as serve:
            wait_until_sync(
                lambda: snapshot_rows_in(tmp / "events.jsonl") > rows // 10, timeout=120, what="rows"
            )
            spared = streams()
            assert spared, "no change stream connected"
            proxy.freeze(spare=spared)

            def said() -> str | None:
                return next(
                    (
                        str(r["reason"])
                        for r in jsonl(log)
                        if r["event"] == "unavailable" and r["what"] == "source"
                    ),
                    None,
                )

            wait_until_sync(lambda: said() is not None, timeout=60, what="the silent connection said")
            wait_until_sync(lambda: snapshot_done(serve), timeout=120, what="snapshot finished")
            assert serve.terminate() == 0
    reason = said()
    assert reason is not None and "no answer for 3 s (query_timeout_s)" in reason, reason


def kill_points(seed: int, rows: int, kills: int) -> list[int]:
    """Snapshot-row counts to SIGKILL serve at: random, all inside the snapshot."""
    rng = random.Random(seed)
    return sorted(rng.sample(range(rows // 20, rows * 3 // 4, 1000), kills))


def pipeline_spec(tmp: Path, source_type: str, config: dict[str, Any], **snapshot: Any) -> dict[str, Any]:
    """A pipeline from ``config`` (an initial snapshot in chunks of 5,000 unless ``snapshot`` says
    otherwise) to the file sink ``tmp/events.jsonl``, checkpoints in ``tmp/cp.db``."""
    return {
        "source": {
            "type": source_type,
            "config": {**config, "snapshot": {"mode": "initial", "chunk_size": 5000, **snapshot}},
        },
        "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}}],
        "batch": {"max_events": 2000, "max_ms": 20},
        "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
    }


def kill_during_snapshot(tmp: Path, spec: dict[str, Any], work: Writer, rows: int, kills: int) -> None:
    """serve on ``spec``, SIGKILLed ``kills`` times at random snapshot points (``work`` starts with
    the first run and goes on)."""
    from tests.helpers import wait_until_sync
    from tests.serve_proc import serve_pipeline

    out = tmp / "events.jsonl"
    for n, at in enumerate(kill_points(seed=7, rows=rows, kills=kills)):
        with serve_pipeline(tmp, spec) as serve:
            if n == 0:
                work.start()
            wait_until_sync(lambda: snapshot_rows_in(out) >= at, timeout=120, what=f"{at} snapshot rows")  # noqa: B023
            serve.kill()
