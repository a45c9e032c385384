"""The chaos suite's own logic: the checks that decide a scenario, and the scenario list."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import chaos.scenarios
from chaos.harness import checks, lost_changes, order_violations
from chaos.proxy.toxics import TYPES
from chaos.runner import Result, scenario_dir, tidy
from chaos.scenarios import SCENARIOS

COMMITTED = [("c", 1, 1), ("c", 2, 1), ("u", 1, 2), ("d", 2, 1), ("u", 1, 3)]


def test_a_complete_in_order_delivery_passes_every_check() -> None:
    assert checks(COMMITTED, COMMITTED) == {"lost": 0, "phantoms": 0, "order_violations": 0, "duplicates": 0}


def test_each_way_of_going_wrong_is_counted() -> None:
    assert checks(COMMITTED, COMMITTED[:-1])["lost"] == 1
    assert checks(COMMITTED, [*COMMITTED, ("u", 1, 9)])["phantoms"] == 1
    assert checks(COMMITTED, [*COMMITTED, *COMMITTED[2:]])["duplicates"] == 3
    swapped = [COMMITTED[0], COMMITTED[2], COMMITTED[1], COMMITTED[4], COMMITTED[3]]
    assert checks(COMMITTED, swapped)["order_violations"] == 0  # other keys may interleave
    assert order_violations([("c", 1, 1), ("u", 1, 3), ("u", 1, 2)]) == 1
    assert order_violations([("c", 2, 1), ("d", 2, 1), ("c", 2, 1)]) == 0  # a replay is no violation
    assert order_violations([("d", 2, 1), ("c", 2, 1)]) == 1


def test_lost_changes_are_named_with_their_place_in_the_commit_order() -> None:
    assert lost_changes(COMMITTED, [COMMITTED[0], COMMITTED[3]]) == ["#1 c 2 v1", "#2 u 1 v2", "#4 u 1 v3"]
    assert lost_changes(COMMITTED, [], most=2) == ["#0 c 1 v1", "#1 c 2 v1"]


def test_every_scenario_module_is_listed_and_pending_ones_say_why() -> None:
    modules = {m.name for m in pkgutil.iter_modules(chaos.scenarios.__path__)} - {"rig"}
    listed = {s.name for s in SCENARIOS}
    assert modules <= listed, f"scenario modules missing from SCENARIOS: {modules - listed}"
    for s in SCENARIOS:
        assert (s.run is None) == bool(s.pending), s.name
        assert s.fault and s.asserts, s.name


def test_the_ci_subset_covers_every_toxic_type_and_a_proxy_down() -> None:
    covered = {t for s in SCENARIOS if s.quick for t in s.toxics}
    assert covered >= {*TYPES, "down"}, f"no quick scenario for {set(TYPES) | {'down'} - covered}"


def test_the_file_reader_leaves_out_a_line_still_being_written(tmp_path: Path) -> None:
    from chaos.harness import file_changes

    path = tmp_path / "events.jsonl"
    whole = b'{"op": "c", "source": {"table": "items"}, "after": {"id": 1, "ver": 1}}\n'
    path.write_bytes(whole + whole[:40])  # the sink is mid-write
    assert file_changes(path) == [("c", 1, 1)]


def test_the_kafka_reader_reads_the_last_record_batch_whole() -> None:
    """Tansu 0.6 answers a partition's high watermark as the last record batch's base offset
    + 1 (ENVIRONMENT.md): a reader that stops there leaves out the rest of that batch. The
    chaos suite's reader did, when a ``consume`` ended inside the last batch (here: 995
    records, then a batch of 9; the first ``consume`` of 1,000 ends after 5 of the 9), and
    ``sink_outage`` reported "kafka: events lost: 8" for a sink that had lost nothing."""
    import orjson
    from confluent_kafka import Producer

    from chaos.harness import kafka_changes
    from tests.servers.tansu import Tansu

    def doc(i: int) -> bytes:
        return orjson.dumps({"op": "c", "after": {"id": i, "ver": 1}, "source": {"table": "items"}})

    def write(bootstrap: str) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "log_level": 3})
        for first, n in ((0, 995), (995, 9)):  # two flushes: the 9 are a record batch of their own
            for i in range(first, first + n):
                producer.produce("cdc", doc(i))
            assert producer.flush(10) == 0

    with Tansu() as broker:
        broker.create_topic("cdc", partitions=1)
        write(broker.bootstrap)
        got = kafka_changes(broker.bootstrap, "cdc")
    assert sorted(key for _, key, _ in got) == list(range(1004))


def test_a_scenario_runs_in_a_folder_emptied_of_what_an_earlier_run_left(tmp_path: Path) -> None:
    """Run twice with one ``--workdir``, a scenario's second ``serve`` would otherwise resume from
    the first run's checkpoints, against servers started afresh, and halt as position lost."""
    first = scenario_dir(tmp_path, "crash_recovery")
    (first / "checkpoints.db").write_bytes(b"the first run's")
    (first / "serve").mkdir()
    (first / "serve" / "log.jsonl").write_text("{}\n")
    (tmp_path / "sink_outage").mkdir()
    (tmp_path / "sink_outage" / "log.jsonl").write_text("{}\n")
    again = scenario_dir(tmp_path, "crash_recovery")
    assert again == tmp_path / "crash_recovery"
    assert again.is_dir() and not any(again.iterdir())
    assert (tmp_path / "sink_outage" / "log.jsonl").exists()  # another scenario's folder is left alone


def scenario_ran(root: Path, name: str, status: str) -> Result:
    folder = scenario_dir(root, name)
    (folder / "events.jsonl").write_text("{}\n")
    return Result(name, status, 1.0, {}, logs=str(folder))


def test_a_run_without_workdir_keeps_only_the_folders_of_failed_scenarios(tmp_path: Path) -> None:
    root = tmp_path / "deltaforge-chaos-x"
    results = [scenario_ran(root, "slow_sink", "passed"), scenario_ran(root, "half_open", "failed")]
    tidy(root, results)
    assert sorted(p.name for p in root.iterdir()) == ["half_open"]
    assert (root / "half_open" / "events.jsonl").exists()
    assert [r.logs for r in results] == ["", str(root / "half_open")]


def test_a_run_without_workdir_where_nothing_failed_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "deltaforge-chaos-x"
    tidy(root, [scenario_ran(root, "slow_sink", "passed"), scenario_ran(root, "half_open", "passed")])
    assert not root.exists()
