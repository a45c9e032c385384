"""Processors on Spark, end to end: ``serve`` with a Turso source, a file sink and a real JVM.

The database is written beforehand by a child process (pyturso locks the file
per process) from a deterministic script; ``reference`` applies the same
processors in plain Python, so the expected output is computed, not pasted.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
import yaml

from deltaforge.pipeline.transformer import UNANSWERED_S
from tests.helpers import first_occurrences, jsonl, stored_checkpoint, wait_until_sync
from tests.serve_proc import Serve
from tests.servers.spark import SparkCluster

JVM_START = 180  # seconds: a cold SparkSession takes 13-22 s here, more on a busy CI machine

WRITE_DB = """
import sys, orjson, turso
path, script = sys.argv[1], orjson.loads(sys.stdin.buffer.read())
conn = turso.connect(path)
conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, email TEXT, amount REAL, status TEXT)")
conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, email TEXT)")
conn.commit()
conn.execute("PRAGMA unstable_capture_data_changes_conn('full')")
for tx in script:
    for sql, params in tx:
        conn.execute(sql, params)
    conn.commit()
last = conn.execute("SELECT max(change_id) FROM turso_cdc").fetchone()[0]
conn.close()
print(last)
"""

READ_CDC = """
import sys, orjson, turso
conn = turso.connect(sys.argv[1])
rows = conn.execute(
    "SELECT change_id, change_type FROM turso_cdc WHERE change_type != 2 AND table_name = 'orders' "
    "ORDER BY change_id"
).fetchall()
last = conn.execute("SELECT max(change_id) FROM turso_cdc").fetchone()[0]
sys.stdout.buffer.write(orjson.dumps({"rows": rows, "last": last}))
"""

PROCESSORS = [
    {"type": "filter", "expr": "after.amount > 100 OR op = 'd'", "tables": ["orders"]},
    {"type": "mask", "columns": {"email": "hash", "status": "drop"}},
    {"type": "mask", "tables": ["customers"], "columns": {"name": "redact"}},
    {
        "type": "sql",
        "tables": ["orders"],
        "query": "SELECT _seq, op, before, after FROM batch WHERE op <> 'u' OR after.amount <> before.amount",
    },
]

Change = tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]


def workload(seed: int = 7) -> tuple[list[list[tuple[str, list[Any]]]], list[Change]]:
    """Transactions to run and the changes they make, in commit order."""
    rng = random.Random(seed)
    orders: dict[int, dict[str, Any]] = {}
    customers: dict[int, dict[str, Any]] = {}
    txs: list[list[tuple[str, list[Any]]]] = []
    changes: list[Change] = []
    next_id = 1
    for _ in range(80):
        tx: list[tuple[str, list[Any]]] = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            roll = rng.random()
            if roll < 0.4 or not orders:
                row = {"id": next_id, "email": f"o{next_id}@example.com",
                       "amount": round(rng.uniform(1, 300), 2), "status": "new"}  # fmt: skip
                next_id += 1
                orders[row["id"]] = row
                tx.append(("INSERT INTO orders VALUES (?, ?, ?, ?)", list(row.values())))
                changes.append(("orders", "c", None, dict(row)))
            elif roll < 0.65:
                oid = rng.choice(sorted(orders))
                before = dict(orders[oid])
                after = dict(before, amount=round(rng.uniform(1, 300), 2))
                if rng.random() < 0.5:
                    after = dict(before, status="paid")  # amount unchanged: the sql step drops it
                orders[oid] = after
                tx.append(("UPDATE orders SET amount = ?, status = ? WHERE id = ?",
                           [after["amount"], after["status"], oid]))  # fmt: skip
                changes.append(("orders", "u", before, dict(after)))
            elif roll < 0.75:
                oid = rng.choice(sorted(orders))
                before = orders.pop(oid)
                tx.append(("DELETE FROM orders WHERE id = ?", [oid]))
                changes.append(("orders", "d", before, None))
            else:
                cid = len(customers) + 1
                row = {"id": cid, "name": f"Customer {cid}", "email": f"c{cid}@example.com"}
                customers[cid] = row
                tx.append(("INSERT INTO customers VALUES (?, ?, ?)", list(row.values())))
                changes.append(("customers", "c", None, dict(row)))
        txs.append(tx)
    # The last transaction is filtered away entirely: checkpoints must still reach its end.
    row = {"id": next_id, "email": "last@example.com", "amount": 5.0, "status": "new"}
    txs.append([("INSERT INTO orders VALUES (?, ?, ?, ?)", list(row.values()))])
    changes.append(("orders", "c", None, row))
    return txs, changes


def reference(changes: list[Change]) -> list[Change]:
    """PROCESSORS, in plain Python."""

    def mask(table: str, image: dict[str, Any] | None) -> dict[str, Any] | None:
        if image is None:
            return None
        out = {k: v for k, v in image.items() if k != "status"}
        out["email"] = hashlib.sha256(str(image["email"]).encode()).hexdigest()
        if table == "customers":
            out["name"] = "***"
        return out

    expected: list[Change] = []
    for table, op, before, after in changes:
        if table == "orders":
            if not (op == "d" or (after is not None and after["amount"] > 100)):
                continue
            if op == "u" and after is not None and before is not None and after["amount"] == before["amount"]:
                continue
        expected.append((table, op, mask(table, before), mask(table, after)))
    return expected


def write_db(path: Path, txs: list[list[tuple[str, list[Any]]]]) -> int:
    out = subprocess.run(
        [sys.executable, "-c", WRITE_DB, str(path)], input=orjson.dumps(txs), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    return int(out.stdout)


def pipeline_yaml(
    tmp: Path, name: str, processors: list[dict[str, Any]] | None, workload: Any = None, **spec: Any
) -> Path:
    source: dict[str, Any] = {"id": "src", "path": str(tmp / "app.db")}
    if workload:
        source["workload"] = workload
    doc = {
        "apiVersion": "deltaforge/v1",
        "kind": "Pipeline",
        "metadata": {"name": name, "tenant": "t"},
        "spec": {
            "source": {"type": "turso", "config": source},
            "sinks": [{"type": "file", "config": {"id": "f", "path": str(tmp / f"{name}.jsonl")}}],
            "batch": {"max_events": 7, "max_ms": 20, "max_inflight": 3},
            "storage": {"type": "sqlite", "path": str(tmp / "cp.db")},
            "supervision": {
                "max_restarts": 5,
                "within_seconds": 120,
                "backoff": {"base_ms": 100, "max_ms": 1000},
            },
            **spec,
        },
    }
    if processors is not None:
        doc["spec"]["processors"] = processors
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def delivered(path: Path) -> list[Change]:
    events = jsonl(path)
    ids = [e["source"]["change_id"] for e in events]
    assert ids == sorted(set(ids)), "events out of source order or repeated"
    return [(e["source"]["table"], e["op"], e["before"], e["after"]) for e in events]


def jvms(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "java"]


def counters(serve: Serve, name: str) -> dict[str, Any]:
    body: dict[str, Any] = serve.get(f"/pipelines/{name}").json()["counters"]
    return body


def run_chain(tmp_path: Path, name: str, **spec: Any) -> list[Change]:
    """Serve the processor chain over the scripted database until it is all checkpointed."""
    txs, changes = workload()
    last = write_db(tmp_path / "app.db", txs)
    # jobs of up to two 7-event batches: a second job starts beside a running one only when full
    spec["spark"] = {"max_job_events": 14, **spec.get("spark", {})}
    cfg = pipeline_yaml(tmp_path, name, PROCESSORS, **spec)
    with Serve(tmp_path, "--config", str(cfg)) as serve:
        serve.wait_api()

        def done() -> bool:
            cp = counters(serve, name)["last_checkpoint"]
            return cp is not None and cp["change_id"] == last

        wait_until_sync(done, timeout=JVM_START, what="every change checkpointed")
        c = counters(serve, name)
        assert c["transform"]["spark_session_starts"] == 1
        assert c["transform"]["events_in"] == len(changes)
        assert c["transform"]["most_inflight"] >= 2  # max_inflight 3: jobs overlapped
        assert c["transform"]["jobs"] < c["transform"]["batches"]  # queued batches shared jobs
        assert serve.terminate() == 0
    assert (stored_checkpoint(tmp_path / "cp.db", "src::sink::f") or {}).get("change_id") == last
    out = delivered(tmp_path / f"{name}.jsonl")
    assert out == reference(changes)
    return out


def test_filter_mask_sql_chain_delivers_the_expected_events_in_order(tmp_path: Path) -> None:
    out = run_chain(tmp_path, "chain")
    # the chain really did something of each kind
    assert any(t == "customers" and a and a["name"] == "***" for t, _, _, a in out)
    assert all("status" not in (a or b or {}) for _, _, b, a in out)
    assert len(out) < len(workload()[1])
    err = (tmp_path / "serve.err").read_text()
    assert '"event":"processors_checked"' in err
    assert "INFO" not in err.replace('"level":"info"', "")  # Spark's own INFO logging is off


def test_a_pipeline_without_processors_never_starts_spark(tmp_path: Path) -> None:
    txs, changes = workload()
    last = write_db(tmp_path / "app.db", txs)
    cfg = pipeline_yaml(tmp_path, "plain", None)
    with Serve(tmp_path, "--config", str(cfg)) as serve:
        serve.wait_api()
        wait_until_sync(
            lambda: (counters(serve, "plain")["last_checkpoint"] or {}).get("change_id") == last,
            timeout=30,
            what="every change checkpointed",
        )
        assert jvms(serve.proc.pid) == []
        tree = serve.get("/pipelines/plain/actors").json()
        assert "SparkTransformer" not in [c["name"] for c in tree["children"]]
        assert counters(serve, "plain")["transform"]["spark_session_starts"] == 0
        assert serve.terminate() == 0
    assert delivered(tmp_path / "plain.jsonl") == changes


def test_bad_processors_are_refused_at_start_with_their_path(tmp_path: Path) -> None:
    txs, _ = workload()
    write_db(tmp_path / "app.db", txs)
    cases = {
        "unknown_column": ([{"type": "filter", "expr": "after.nope > 1"}], "spec.processors[0].expr", "nope"),
        "bad_sql": (
            [PROCESSORS[0], {"type": "sql", "query": "SELEC _seq FROM batch"}],
            "spec.processors[1].query",
            "PARSE_SYNTAX_ERROR",
        ),
        "not_event_rows": (
            [{"type": "sql", "tables": ["orders"], "query": "SELECT count(*) AS n FROM batch"}],
            "spec.processors[0]: must return event rows",
            "got n",
        ),
        "mask_column": (
            [{"type": "mask", "tables": ["customers"], "columns": {"amount": "hash"}}],
            "spec.processors[0].columns.amount",
            "no such column",
        ),
    }
    docs = []
    for name, (procs, _, _) in cases.items():
        doc = yaml.safe_load(pipeline_yaml(tmp_path, name, procs).read_text())
        doc["spec"]["source"]["config"]["id"] = f"src_{name}"  # one store: a source id each
        docs.append(doc)
    both = tmp_path / "bad.yaml"
    both.write_text(yaml.safe_dump_all(docs))
    log = tmp_path / "log.jsonl"
    with Serve(tmp_path, "--config", str(both), "--log-file", str(log)) as serve:
        serve.wait_api()

        def all_failed() -> bool:
            return all(p["state"] == "failed" for p in serve.get("/pipelines").json())

        try:
            wait_until_sync(all_failed, timeout=JVM_START, what="every pipeline refused")
        except AssertionError as exc:  # say where each pipeline stands, and what serve logged last
            states = {p["name"]: p["state"] for p in serve.get("/pipelines").json()}
            tail = log.read_text().splitlines()[-40:] if log.exists() else []
            raise AssertionError(f"{exc}; states {states}; log tail:\n" + "\n".join(tail)) from None
        for name, (_, path, detail) in cases.items():
            failure = serve.get(f"/pipelines/{name}").json()["failure"]
            assert failure.startswith(path), failure
            assert detail in failure
            # refused before any event flowed
            assert not (tmp_path / f"{name}.jsonl").exists() or jsonl(tmp_path / f"{name}.jsonl") == []
            assert counters(serve, name)["events_read"] == 0
    assert [stored_checkpoint(tmp_path / "cp.db", f"src_{name}::sink::f") for name in cases] == [None] * len(
        cases
    )


def test_killing_the_spark_jvm_restarts_the_session_and_loses_nothing(tmp_path: Path) -> None:
    processors = [{"type": "filter", "expr": "op <> 'd'"}, {"type": "mask", "columns": {"customer": "hash"}}]
    cfg = pipeline_yaml(
        tmp_path,
        "jvm",
        processors,
        workload={"rows_per_second": 150, "max_rows": 2500},
        batch={"max_events": 50, "max_ms": 20, "max_inflight": 2},
    )
    with Serve(tmp_path, "--config", str(cfg), "--log-file", str(tmp_path / "log.jsonl")) as serve:
        serve.wait_api()
        wait_until_sync(
            lambda: counters(serve, "jvm")["transform"]["batches"] >= 5, timeout=JVM_START, what="transforms"
        )
        [java] = jvms(serve.proc.pid)
        java.kill()
        java.wait(10)
        wait_until_sync(
            lambda: counters(serve, "jvm")["transform"]["spark_session_starts"] == 2,
            timeout=JVM_START,
            what="a new Spark session",
        )
        before = counters(serve, "jvm")["transform"]["batches"]
        wait_until_sync(
            lambda: counters(serve, "jvm")["transform"]["batches"] > before + 3, timeout=60, what="transforms"
        )
        tree = serve.get("/pipelines/jvm/actors").json()
        node = next(c for c in tree["children"] if c["name"] == "SparkTransformer")
        assert node["restarts"] >= 1 and node["state"] == "running"
        assert len(jvms(serve.proc.pid)) == 1

        def settled() -> bool:
            workload_done = next(c for c in tree_now()["children"] if c["name"] == "DemoWorkload")["state"]
            first = counters(serve, "jvm")["last_checkpoint"]
            time.sleep(2)
            return workload_done != "running" and counters(serve, "jvm")["last_checkpoint"] == first

        def tree_now() -> dict[str, Any]:
            body: dict[str, Any] = serve.get("/pipelines/jvm/actors").json()
            return body

        wait_until_sync(settled, timeout=120, what="the workload written and delivered")
        assert serve.terminate() == 0
    cdc = orjson.loads(subprocess.run([sys.executable, "-c", READ_CDC, str(tmp_path / "app.db")],
                                      capture_output=True, check=True, timeout=60).stdout)  # fmt: skip
    wanted = [cid for cid, kind in cdc["rows"] if kind != -1]
    events = jsonl(tmp_path / "jvm.jsonl")
    ids = first_occurrences([e["source"]["change_id"] for e in events])
    assert ids == wanted  # every non-delete change, in order, none lost (a replay may repeat some)
    assert all(len(e["after"]["customer"]) == 64 for e in events)
    assert (stored_checkpoint(tmp_path / "cp.db", "src::sink::f") or {}).get("change_id") == cdc["last"]
    log = (tmp_path / "log.jsonl").read_text()
    assert log.count('"event":"spark_session_started"') == 2
    assert '"event":"spark_session_lost"' in log


def test_a_spark_jvm_that_stops_answering_is_said_and_waited_for(tmp_path: Path) -> None:
    """A JVM that stops answering (stopped, swapped out, in a garbage collector's spiral) holds its
    job for ever, and with it every batch: the pipeline said ``running`` and ``/health`` ok while
    nothing was delivered. A job unanswered for ``UNANSWERED_S`` lists ``transform`` as unavailable
    (``degraded``); answered again, the pipeline is ok and has lost nothing."""
    processors = [{"type": "filter", "expr": "op <> 'd'"}]
    cfg = pipeline_yaml(
        tmp_path, "hung", processors, workload={"rows_per_second": 100, "max_rows": 1500},
        batch={"max_events": 50, "max_ms": 20, "max_inflight": 1},
    )  # fmt: skip
    with Serve(tmp_path, "--config", str(cfg)) as serve:
        serve.wait_api()
        wait_until_sync(
            lambda: counters(serve, "hung")["transform"]["batches"] >= 3, timeout=JVM_START, what="transforms"
        )
        [java] = jvms(serve.proc.pid)
        java.suspend()
        try:

            def said() -> bool:
                body = serve.get("/health").json()
                return body["status"] == "degraded" and "transform" in body["unavailable"].get("hung", {})

            wait_until_sync(said, timeout=UNANSWERED_S + 30, what="/health degraded by the transform")
        finally:
            java.resume()
        wait_until_sync(lambda: serve.get("/health").json()["status"] == "ok", timeout=60, what="/health ok")

        def written() -> bool:
            tree = serve.get("/pipelines/hung/actors").json()
            return next(c for c in tree["children"] if c["name"] == "DemoWorkload")["state"] != "running"

        wait_until_sync(written, timeout=120, what="the workload written")
        assert serve.terminate() == 0
    # The source holds the database's lock while it runs: read it now, then let the pipeline
    # (without the workload) finish what it had not read.
    cdc = orjson.loads(subprocess.run([sys.executable, "-c", READ_CDC, str(tmp_path / "app.db")],
                                      capture_output=True, check=True, timeout=60).stdout)  # fmt: skip
    with Serve(tmp_path, "--config", str(pipeline_yaml(tmp_path, "hung", processors))) as serve:
        serve.wait_api()
        wait_until_sync(
            lambda: (stored_checkpoint(tmp_path / "cp.db", "src::sink::f") or {}).get("change_id") == cdc["last"],
            timeout=JVM_START, what="every change checkpointed",
        )  # fmt: skip
        assert serve.terminate() == 0
    wanted = [cid for cid, kind in cdc["rows"] if kind != -1]
    assert first_occurrences([e["source"]["change_id"] for e in jsonl(tmp_path / "hung.jsonl")]) == wanted


@pytest.fixture()
def spark_cluster() -> Any:
    with SparkCluster() as cluster:
        yield cluster


def test_the_same_chain_runs_on_a_standalone_cluster(tmp_path: Path, spark_cluster: SparkCluster) -> None:
    out = run_chain(tmp_path, "cluster", spark={"master": spark_cluster.master_url})
    assert out == reference(workload()[1])  # identical to the local run's expected output
    assert "Registered app deltaforge" in (spark_cluster.dir / "master.log").read_text()
