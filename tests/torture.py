"""A seeded random workload per source, with serve SIGKILLed at random points: the file sink must
replay to the source's final state, each row's versions in order.

Random multi-row, multi-table transactions: inserts, updates, primary-key updates, deletes, NULLs,
unicode, binary, decimals and timestamps with zones; random batch limits, respect_source_tx on or
off, one or two batches in flight. The seed is in every failure message; rerun one with
``DF_TORTURE_SEED=<seed>``. ``DF_TORTURE_TXS`` and ``DF_TORTURE_KILLS`` make a long run:

    DF_TORTURE_TXS=5000 DF_TORTURE_KILLS=40 .venv/bin/python -m pytest tests/test_torture.py
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import yaml

from deltaforge.envelopes import encode
from tests.helpers import jsonl, wait_until_sync
from tests.serve_proc import Serve

SEED = int(os.environ.get("DF_TORTURE_SEED", str(random.SystemRandom().randrange(10**6))))
TXS = int(os.environ.get("DF_TORTURE_TXS", "120"))
KILLS = int(os.environ.get("DF_TORTURE_KILLS", "4"))
TEXTS = ["plain", "héllo ✓", "😀 emoji", "quote ' and \" both", "", "line\nbreak", "ünïcødé"]
DONE_KEY = 10**6  # the last transaction inserts this key into b: when it arrives, everything has

Op = tuple[Any, ...]


class Model:
    """Random transactions on ``a (id, txt, num, bin, ts, ver)`` and ``b (k, v)``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.live: dict[str, set[int]] = {"a": set(), "b": set()}
        self.next = {"a": 1, "b": 1}
        self.ver: dict[int, int] = {}

    def _row_a(self, key: int) -> dict[str, Any]:
        r = self.rng
        self.ver[key] = self.ver.get(key, 0) + 1
        return {
            "id": key,
            "txt": r.choice([*TEXTS, None]),
            "num": None if r.random() < 0.1 else Decimal(r.randrange(-(10**8), 10**8)) / Decimal(10**4),
            "bin": None if r.random() < 0.1 else r.randbytes(r.randrange(0, 12)),
            "ts": None
            if r.random() < 0.1
            else dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
            + dt.timedelta(seconds=r.randrange(0, 10**8), microseconds=r.randrange(0, 10**6)),
            "ver": self.ver[key],
        }

    def transaction(self) -> list[Op]:
        r, ops = self.rng, []
        for _ in range(r.randrange(1, 6)):
            table = r.choice(["a", "a", "b"])
            live = self.live[table]
            kind = r.choice(["insert", "insert", "update", "rekey", "delete"]) if live else "insert"
            if kind == "insert":
                key = self.next[table]
                self.next[table] += 1
                live.add(key)
                ops.append(
                    ("insert", table, self._row_a(key) if table == "a" else {"k": key, "v": r.choice(TEXTS)})
                )
            elif kind == "update":
                key = r.choice(sorted(live))
                row = self._row_a(key) if table == "a" else {"k": key, "v": r.choice(TEXTS)}
                ops.append(("update", table, key, row))
            elif kind == "rekey":
                old = r.choice(sorted(live))
                new = self.next[table]
                self.next[table] += 1
                live.discard(old)
                live.add(new)
                if table == "a":
                    self.ver[new] = self.ver.pop(old, 0)
                ops.append(("rekey", table, old, new))
            else:
                key = r.choice(sorted(live))
                live.discard(key)
                ops.append(("delete", table, key))
        return ops


def replay(docs: list[dict[str, Any]]) -> dict[str, dict[Any, Any]]:
    """The state a sink's events build, applied in the order it holds them. A replay after a crash
    re-appends a suffix of what was written, in order, so applying it again ends the same."""
    state: dict[str, dict[Any, Any]] = {"a": {}, "b": {}}
    for d in docs:
        table = d["source"]["table"]
        key_col = "id" if table == "a" else "k"
        before, after = d["before"], d["after"]
        if before is not None and (after is None or before.get(key_col) != after.get(key_col)):
            state[table].pop(before[key_col], None)
        if after is not None:
            state[table][after[key_col]] = after
    return state


def per_key_order(docs: list[dict[str, Any]]) -> list[str]:
    """First occurrences of each row version must come in increasing version order."""
    firsts: dict[int, list[int]] = {}
    seen: set[tuple[int, int]] = set()
    for d in docs:
        after = d["after"]
        if d["source"]["table"] == "a" and after is not None and d["op"] in ("c", "u"):
            mark = (after["id"], after["ver"])
            if mark not in seen:
                seen.add(mark)
                firsts.setdefault(after["id"], []).append(after["ver"])
    return [f"row a.{k}: versions {v}" for k, v in firsts.items() if v != sorted(v)]


def normalised(state: dict[str, dict[Any, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Rows as the JSON envelope encodes them (decimals, bytes, times as text), keyed by text."""
    return {
        table: {str(k): orjson.loads(encode(row)) for k, row in rows.items()} for table, rows in state.items()
    }


def pipeline(
    tmp: Path, source: dict[str, Any], rng: random.Random, sinks: list[dict[str, Any]] | None = None
) -> Path:
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": "torture"},
        "spec": {
            "source": source,
            "sinks": [
                {"type": "file", "config": {"id": "f", "path": str(tmp / "events.jsonl")}},
                *(sinks or []),
            ],
            "batch": {
                "max_events": rng.choice([1, 3, 7, 50, 500]),
                "max_ms": rng.choice([5, 20, 100]),
                "respect_source_tx": rng.choice([True, False]),
                "max_inflight": rng.choice([1, 2]),
            },
            "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
        },
    }
    path = tmp / "torture.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(
    tmp: Path,
    source: dict[str, Any],
    env: dict[str, str],
    write: Callable[[list[Op]], None],
    final_state: Callable[[], dict[str, dict[Any, dict[str, Any]]]],
    concurrent: bool = True,
    sinks: dict[str, tuple[dict[str, Any], Callable[[], dict[str, dict[Any, dict[str, Any]]]]]] | None = None,
    logs: dict[str, tuple[dict[str, Any], Callable[[], list[dict[str, Any]]]]] | None = None,
) -> None:
    """Write TXS random transactions while serve is killed KILLS times, then check the file sink's
    replay, the state each of ``sinks`` (name: (sink entry, its state)) ends with, and the replay
    and per-key order of each of ``logs`` (name: (sink entry, the events it holds, in order))."""
    rng = random.Random(SEED)
    model = Model(random.Random(SEED + 1))
    entries = [entry for entry, _ in (sinks or {}).values()] + [entry for entry, _ in (logs or {}).values()]
    cfg = pipeline(tmp, source, rng, entries)
    batches = [model.transaction() for _ in range(TXS)] + [[("insert", "b", {"k": DONE_KEY, "v": "done"})]]
    per_round = max(1, len(batches) // (KILLS + 1))
    out = tmp / "events.jsonl"
    where = f"seed={SEED} ({cfg.read_text()!r})"
    for n in range(KILLS + 1):
        chunk = batches[n * per_round : (n + 1) * per_round] if n < KILLS else batches[n * per_round :]
        if not concurrent:
            for tx in chunk:
                write(tx)
        with Serve(tmp, "--config", str(cfg), env=env) as serve:
            if n == 0:  # no snapshot yet: what is written before the source is first open is not captured
                serve.wait_api()
                serve.wait_source_open("torture")
            failed: list[BaseException] = []

            def write_all(c: list[list[Op]] = chunk, failed: list[BaseException] = failed) -> None:
                try:
                    for tx in c:
                        write(tx)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
                    failed.append(exc)

            writer = threading.Thread(target=write_all)
            if concurrent:
                writer.start()
            if n < KILLS:
                time.sleep(rng.uniform(0.2, 1.5))  # the crash point: random, by design
                serve.kill()
                if concurrent:
                    writer.join(60)
                    assert not failed, f"the workload failed: {failed[0]!r}; {where}"
                continue
            if concurrent:
                writer.join(60)
                assert not failed, f"the workload failed: {failed[0]!r}; {where}"

            def done() -> bool:
                return any(d["after"] and d["after"].get("k") == DONE_KEY for d in jsonl(out))

            wait_until_sync(done, timeout=120, what=f"the last transaction delivered, {where}")
            assert serve.terminate() == 0
    want = normalised(final_state())
    for name, (_, docs_of) in {"file": ({}, lambda: jsonl(out)), **(logs or {})}.items():
        docs = docs_of()
        _same(normalised(replay(docs)), want, f"{name} sink, {where}")
        assert not per_key_order(docs), f"{name} sink: {per_key_order(docs)[:5]}; {where}"
    for name, (_, state_of) in (sinks or {}).items():
        _same(normalised(state_of()), want, f"{name} sink, {where}")


def _same(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]], where: str) -> None:
    for table in ("a", "b"):
        missing = sorted(set(want[table]) - set(got[table]), key=int)[:10]
        extra = sorted(set(got[table]) - set(want[table]), key=int)[:10]
        assert not missing and not extra, f"{table}: missing {missing}, extra {extra}; {where}"
        wrong = [k for k in want[table] if got[table][k] != want[table][k]][:5]
        assert not wrong, f"{table}: rows differ {[(got[table][k], want[table][k]) for k in wrong]}; {where}"
