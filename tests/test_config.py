"""Config validation: every wrong field is named with its path and what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deltaforge.config import ConfigError, load, parse_pipeline
from tests.kit import doc

GOOD = """
apiVersion: deltaforge/v1
kind: Pipeline
metadata: {name: orders, tenant: acme}
spec:
  source: {type: turso, config: {id: orders-db, path: "${DATA}/orders.db", tables: [orders]}}
  sinks:
    - {type: file, config: {id: f1, path: "${DATA}/events.jsonl", envelope: {type: debezium}}}
    - {type: stdout, config: {id: out, required: false, format: pretty}}
  supervision: {strategy: one_for_all, max_restarts: 5, within_seconds: 60, backoff: {base_ms: 100, max_ms: 10000}}
  batch: {max_events: 2000, max_bytes: 16777216, max_ms: 50, respect_source_tx: true, max_inflight: 1}
  commit_policy: {mode: required}
"""


def errors_of(d: Any, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(d, env=env or {})
    return info.value.errors


def test_good_config_parses_with_env_and_defaults() -> None:
    cfg = parse_pipeline(yaml.safe_load(GOOD), env={"DATA": "/tmp/x"})
    assert cfg.name == "orders" and cfg.tenant == "acme"
    assert cfg.source.config.path == "/tmp/x/orders.db"
    assert [s.id for s in cfg.sinks] == ["f1", "out"]
    assert cfg.sinks[0].envelope == "debezium" and cfg.sinks[0].required
    assert not cfg.sinks[1].required
    assert cfg.batch.max_events == 2000 and cfg.supervision.backoff_max_ms == 10000


def test_templates_with_dots_are_left_for_the_sink() -> None:
    d = doc(sinks=[{"type": "file", "config": {"id": "f", "path": "out/${source.table}.jsonl"}}])
    cfg = parse_pipeline(d, env={})
    assert cfg.sinks[0].config.path == "out/${source.table}.jsonl"


def test_unknown_source_and_sink_types() -> None:
    d = doc(sinks=[{"type": "carrier-pigeon", "config": {"id": "p"}}])
    d["spec"]["source"]["type"] = "oracle"
    errs = errors_of(d)
    assert any(e.startswith("spec.source.type: unknown source type 'oracle'") for e in errs)
    assert any(e.startswith("spec.sinks[0].type: unknown sink type 'carrier-pigeon'") for e in errs)


def test_missing_required_fields() -> None:
    d = doc(sinks=[{"type": "file", "config": {"id": "f"}}])
    del d["spec"]["source"]["config"]["path"]
    del d["metadata"]["name"]
    errs = errors_of(d)
    assert "spec.sinks[0].config.path: required (a string)" in errs
    assert "spec.source.config.path: required (a string)" in errs
    assert "metadata.name: required (a string)" in errs


def test_wrong_types() -> None:
    d = doc(batch={"max_events": "lots", "respect_source_tx": "yes"}, commit_policy={"mode": "most"})
    errs = errors_of(d)
    assert "spec.batch.max_events: expected an integer >= 1, got 'lots'" in errs
    assert "spec.batch.respect_source_tx: expected true or false, got 'yes'" in errs
    assert "spec.commit_policy.mode: expected one of required, all, quorum, got 'most'" in errs


def test_bad_env_references() -> None:
    d = doc(sinks=[{"type": "file", "config": {"id": "f", "path": "${NOPE}/x"}}])
    d["spec"]["source"]["config"]["path"] = "${1bad}"
    errs = errors_of(d)
    assert "spec.sinks[0].config.path: environment variable NOPE is not set" in errs
    assert any(e.startswith("spec.source.config.path: bad variable reference ${1bad}") for e in errs)
    unset = errors_of(doc(sinks=[{"type": "file", "config": {"id": "f", "path": "${NOPE}"}}]))
    # said once: not also as the empty value the reference left
    assert [e for e in unset if e.startswith("spec.sinks[0].config.path:")] == [
        "spec.sinks[0].config.path: environment variable NOPE is not set"
    ]


def test_unknown_fields_and_duplicates_and_quorum() -> None:
    d = doc(
        sinks=[
            {"type": "stdout", "config": {"id": "a", "colour": 1}},
            {"type": "stdout", "config": {"id": "a"}},
        ],
        commit_policy={"mode": "quorum", "quorum": 5},
    )
    errs = errors_of(d)
    assert any(e.startswith("spec.sinks[0].config.colour: unknown field") for e in errs)
    assert "spec.sinks: sink id 'a' is used more than once" in errs
    assert "spec.commit_policy.quorum: expected 1..2 with mode quorum, got 5" in errs


def test_one_for_one_is_refused_at_pipeline_level() -> None:
    errs = errors_of(doc(supervision={"strategy": "one_for_one"}))
    assert any(
        e.startswith("spec.supervision.strategy: expected one of one_for_all, rest_for_one") for e in errs
    )


def test_load_folder_of_pipelines(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc(name="a")))
    (tmp_path / "b.yml").write_text(yaml.safe_dump(doc(name="b")) + "---\n" + yaml.safe_dump(doc(name="c")))
    assert [p.name for p in load(tmp_path, env={})] == ["a", "b", "c"]


def test_pipelines_of_one_folder_reading_one_postgres_slot_are_refused_naming_both(tmp_path: Path) -> None:
    """Two documents whose PostgreSQL sources read one database with the same slot (the default
    ``deltaforge`` in both): a slot has one reader, so one of them would wait for ever. Refused when
    the folder is read, naming both pipelines; the same slot name on other databases is fine."""

    def pg(name: str, dsn: str, **extra: Any) -> dict[str, Any]:
        d = doc(name=name)
        d["spec"]["source"] = {"type": "postgres", "config": {"id": name, "dsn": dsn, **extra}}
        return d

    docs = [pg("orders", "postgresql://u:pw@db:5432/app"), pg("billing", "postgresql://v:pw2@db/app?sslmode=require"),
            pg("search", "postgresql://u:pw@db:5432/app", slot="search"), pg("audit", "postgresql://u:pw@db:5432/other")]  # fmt: skip
    (tmp_path / "p.yaml").write_text("---\n".join(yaml.safe_dump(d) for d in docs))
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, env={})
    assert refused.value.errors == [
        "spec.source.config.slot: pipelines 'orders' and 'billing' read slot 'deltaforge' of one database "
        "(db:5432/app): a slot has one reader, so one would wait for ever; give each a slot and publication of its own"
    ]
    assert "pw" not in str(refused.value.errors)


def test_pipelines_of_one_folder_in_one_kafka_consumer_group_are_refused_naming_both(tmp_path: Path) -> None:
    """Two documents whose Kafka sources read one cluster with one consumer group: Kafka splits the
    partitions between them, so each would deliver part of the records without a word. Refused
    when the folder is read; the same group id on another cluster is fine."""

    def kafka(name: str, brokers: str, group: str) -> dict[str, Any]:
        d = doc(name=name)
        d["spec"]["source"] = {"type": "kafka", "config": {"id": name, "brokers": brokers, "topics": ["t"],
                                                          "group_id": group}}  # fmt: skip
        return d

    docs = [kafka("a", "k1:9092,k2:9092", "cdc"), kafka("b", "k2:9092", "cdc"), kafka("c", "k1:9092", "other"),
            kafka("d", "elsewhere:9092", "cdc")]  # fmt: skip
    (tmp_path / "p.yaml").write_text("---\n".join(yaml.safe_dump(d) for d in docs))
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, env={})
    assert refused.value.errors == [
        "spec.source.config.group_id: pipelines 'a' and 'b' read one cluster (k2:9092) in consumer group 'cdc': "
        "Kafka splits the partitions between them, so each would deliver part of the records; give each a "
        "group of its own"
    ]


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltaforge", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_validate_cli_lists_every_wrong_field(tmp_path: Path) -> None:
    bad = doc(sinks=[{"type": "kafkaa", "config": {"id": "k"}}, {"type": "file", "config": {"id": "f"}}])
    bad["spec"]["batch"] = {"max_ms": -1}
    bad["spec"]["source"]["config"]["path"] = "${MISSING_VAR_FOR_TEST}"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    r = _validate(f)
    assert r.returncode != 0
    for expected in (
        "spec.sinks[0].type: unknown sink type 'kafkaa'",
        "spec.sinks[1].config.path: required",
        "spec.batch.max_ms: expected an integer >= 1, got -1",
        "spec.source.config.path: environment variable MISSING_VAR_FOR_TEST is not set",
    ):
        assert expected in r.stderr, r.stderr


def test_validate_cli_accepts_good_file(tmp_path: Path) -> None:
    f = tmp_path / "good.yaml"
    f.write_text(GOOD.replace("${DATA}", str(tmp_path)))
    r = _validate(f)
    assert r.returncode == 0, r.stderr
    assert "ok: pipeline 'orders'" in r.stdout


def test_a_fixed_kafka_topic_that_kafka_does_not_allow_is_refused_naming_it() -> None:
    sink = {"type": "kafka", "config": {"id": "k", "brokers": "b:9092", "topic": "bad topic!"}}
    assert errors_of(doc(sinks=[sink])) == [
        "spec.sinks[0].config.topic: 'bad topic!' is not a legal Kafka topic name "
        "(1-249 letters, digits, '.', '_' or '-')"
    ]
    sink["config"]["topic"] = "cdc.${source.table}"  # rendered per event: checked then (poison)
    parse_pipeline(doc(sinks=[sink]), env={})


def test_ten_different_mistakes_are_all_reported_with_their_paths() -> None:
    d = doc(
        sinks=[
            {"type": "kafka", "config": {"id": "k", "topic": "cdc.${source.nope}", "timeout_s": -1}},
            {"type": "redis", "config": {"id": "r", "uri": "http://x", "stream": "s", "maxlen": "lots"}},
            {"type": "stdout", "config": {"id": "k", "format": "xml"}},
        ],
        batch={"max_inflight": 0},
        commit_policy={"mode": "quorum", "quorum": 4},
    )
    d["spec"]["source"]["config"]["poll_interval_ms"] = True
    d["spec"]["source"]["config"]["tables"] = "orders"
    errs = errors_of(d)
    expected = [
        "spec.sinks[0].config.brokers: required (a string)",
        "spec.sinks[0].config.topic: unknown template field ${source.nope}",
        "spec.sinks[0].config.timeout_s: expected a positive number, got -1",
        "spec.sinks[1].config.uri: expected redis://[user:password@]host:port[/db]",
        "spec.sinks[1].config.maxlen: expected an integer >= 0, got 'lots'",
        "spec.sinks[2].config.format: expected one of pretty, json, got 'xml'",
        "spec.sinks: sink id 'k' is used more than once",
        "spec.batch.max_inflight: expected an integer >= 1, got 0",
        "spec.commit_policy.quorum: expected 1..3 with mode quorum, got 4",
        "spec.source.config.poll_interval_ms: expected an integer >= 1, got True",
        "spec.source.config.tables: expected a list of table names, got 'orders'",
    ]
    for e in expected:
        assert any(x.startswith(e) for x in errs), (e, errs)
    assert len(errs) == len(expected), errs


def test_a_nats_cluster_is_given_as_comma_separated_urls_each_checked() -> None:
    sink = {"type": "nats", "config": {"id": "n", "url": "nats://a:4222,http://b:4222", "subject": "x",
                                       "stream_replicas": 0}}  # fmt: skip
    assert errors_of(doc(sinks=[sink])) == [
        "spec.sinks[0].config.url: expected nats://host:port, or several comma-separated (the servers of a cluster)",
        "spec.sinks[0].config.stream_replicas: expected an integer >= 1, got 0",
    ]
    sink["config"].update(url="nats://a:4222,tls://b:4222,nats://c:4222", stream_replicas=3)
    assert parse_pipeline(doc(sinks=[sink]), env={}).sinks[0].config.url.count(",") == 2


def test_a_password_in_a_bad_dsn_is_never_echoed() -> None:
    d = doc()
    d["spec"]["source"] = {"type": "mysql", "config": {"id": "m", "dsn": "postgres://u:hunter2@h/db"}}
    errs = errors_of(d)
    assert errs == ["spec.source.config.dsn: expected mysql://user:password@host:port/db"]
    assert not any("hunter2" in e for e in errs)


def test_a_secret_setting_of_the_wrong_type_is_named_and_its_value_never_echoed() -> None:
    """A Kafka sink passes librdkafka settings on as given (``producer``); one that holds a
    secret is named in the error, with the type it had, never its value."""
    d = doc()
    d["spec"]["sinks"] = [{"type": "kafka", "config": {"id": "k", "brokers": "b:9092", "topic": "t",
                           "producer": {"sasl.password": ["hunter2"], "linger.ms": [5]}}}]  # fmt: skip
    errs = errors_of(d)
    assert "spec.sinks[0].config.producer.sasl.password.str: input should be a valid string, got a list " \
        "(not shown: a secret)" in errs  # fmt: skip
    assert any(e.startswith("spec.sinks[0].config.producer.linger.ms.str:") and "[5]" in e for e in errs)
    assert not any("hunter2" in e for e in errs)


def test_kafka_producer_settings_that_would_weaken_delivery_are_refused_naming_them() -> None:
    """``producer`` passes librdkafka settings on as given, and they used to override deltaforge's
    own: ``acks: 1`` let a checkpoint pass records a broker failover then lost, silently."""
    d = doc()
    d["spec"]["sinks"] = [{"type": "kafka", "config": {"id": "k", "brokers": "b:9092", "topic": "t",
                           "producer": {"acks": 1, "enable.idempotence": False, "linger.ms": 20}}}]  # fmt: skip
    [err] = errors_of(d)
    assert err.startswith("spec.sinks[0].config.producer: acks=1: deltaforge needs acks=all")
    assert "; enable.idempotence=False: deltaforge needs the idempotent producer" in err
    d["spec"]["sinks"][0]["config"]["producer"] = {"transactional.id": "mine"}
    assert "use exactly_once: true instead" in errors_of(d)[0]
    d["spec"]["sinks"][0]["config"]["producer"] = {"acks": "all", "enable.idempotence": True, "linger.ms": 20}
    parse_pipeline(d, env={})  # what it would set anyway, and any other setting, pass


def test_a_commit_policy_no_sink_can_satisfy_is_refused() -> None:
    """Every sink optional under 'required' would commit with zero acks: nothing ever checkpointed."""
    d = doc(sinks=[{"type": "stdout", "config": {"id": "a", "required": False}},
                   {"type": "stdout", "config": {"id": "b"}, "required": False}])  # fmt: skip
    errs = errors_of(d)
    assert any(
        e.startswith("spec.commit_policy.mode: 'required' needs at least one sink with required: true")
        for e in errs
    )
    d["spec"]["commit_policy"] = {"mode": "all"}
    parse_pipeline(d, env={})  # all (or quorum) waits for optional sinks too: fine


def test_a_wrong_journal_names_each_field_with_what_was_expected() -> None:
    from tests.kit import doc

    bad = doc(journal={"enabled": True, "dlq": {"overflow_policy": "explode", "max_entries": 0}})
    with pytest.raises(ConfigError) as exc:
        parse_pipeline(bad, env={})
    assert exc.value.errors == [
        "spec.journal.dlq.max_entries: expected an integer >= 1, got 0",
        "spec.journal.dlq.overflow_policy: expected one of drop_oldest, reject, block, got 'explode'",
    ]


def test_a_source_template_names_each_table_apart_and_a_row_template_each_row() -> None:
    """``cdc.${source.table}`` is kept per table (rendering it per event was slow): a kept name
    must still be per table, and a template with a row field per row."""
    from dataclasses import replace

    from deltaforge.sinks.templates import compile_template
    from tests.kit import make_event

    by_table = compile_template("cdc.${source.db}.${source.table}")
    by_one = compile_template("cdc.${source.table}")  # kept by the one field's value alone
    by_row = compile_template("t.${source.table}.${after.id}")
    a = make_event(1)
    b = replace(a, source=replace(a.source, table="other"))
    c = replace(a, source=replace(a.source, db="elsewhere"))
    assert [by_table(e) for e in (a, b, a, b, c)] == ["cdc.db.t", "cdc.db.other", "cdc.db.t", "cdc.db.other",
                                                      "cdc.elsewhere.t"]  # fmt: skip
    assert [by_one(e) for e in (a, b, a, b, c)] == ["cdc.t", "cdc.other", "cdc.t", "cdc.other", "cdc.t"]
    assert [by_row(e) for e in (make_event(1), make_event(2), b)] == ["t.t.1", "t.t.2", "t.other.1"]


def test_an_address_whose_port_or_host_cannot_be_read_is_refused_naming_the_field() -> None:
    """Only the scheme was checked: ``validate`` then failed with a traceback (``ValueError: Port
    could not be cast to integer value``, a PostgreSQL source's slot being keyed by its DSN's host
    and port), or ``serve`` did at the first connection. The value is never echoed."""
    d = doc(sinks=[
        {"type": "redis", "config": {"id": "r", "uri": "redis://:hunter2@cache:637900", "stream": "s"}},
        {"type": "nats", "config": {"id": "n", "url": "nats://a:4222,nats://b:42x22", "subject": "s"}},
        {"type": "kafka", "config": {"id": "k", "brokers": "k1:9092,k2:0", "topic": "t"}},
        {"type": "postgres", "config": {"id": "p", "dsn": "postgresql://u:hunter2@[::1/db", "table": "t"}},
    ])  # fmt: skip
    d["spec"]["source"] = {
        "type": "postgres",
        "config": {"id": "pg", "dsn": "postgresql://u:hunter2@db:notaport/app"},
    }
    errs = errors_of(d)
    assert errs == [
        "spec.source.config.dsn: expected postgresql://user:password@host:port/db: the port is not a number "
        "from 1 to 65535",
        "spec.sinks[0].config.uri: expected redis://[user:password@]host:port[/db]: the port is not a number "
        "from 1 to 65535",
        "spec.sinks[1].config.url: expected nats://host:port: the port is not a number from 1 to 65535",
        "spec.sinks[2].config.brokers: expected host:port[,host:port...]: the port is not a number from 1 to 65535",
        "spec.sinks[3].config.dsn: expected postgresql://user:password@host:port/db: an IPv6 host whose bracket "
        "does not close",
    ]
    assert not any("hunter2" in e for e in errs)
    d = doc()
    d["spec"]["source"] = {"type": "mysql", "config": {"id": "m", "dsn": "mysql://u:hunter2@db:3306x/shop"}}
    assert errors_of(d) == [
        "spec.source.config.dsn: expected mysql://user:password@host:port/db: the port is not a number from "
        "1 to 65535"
    ]


@pytest.mark.parametrize(("dsn", "problem"), [
    ("postgresql://cdc:hun/ter2@db:5432/shop",
     "the user or password holds a '/', '?' or '#': write it percent-encoded (%2F, %3F, %23)"),
    ("postgresql://cdc:hun?ter2@db:5432/shop",
     "the user or password holds a '/', '?' or '#': write it percent-encoded (%2F, %3F, %23)"),
    ("postgresql://cdc:hun@ter2@db:5432/shop",
     "the password holds an '@': write it %40 (the driver ends the password at the first '@')"),
])  # fmt: skip
def test_a_password_a_driver_would_misread_is_refused_without_a_word_of_it(dsn: str, problem: str) -> None:
    """Written as it is, ``hun/ter2`` made asyncpg take ``ter2@db`` for the host and ``hun`` for the
    port: ``invalid literal for int() with base 10: 'hun'``, the password's start in the pipeline's
    error and log; asyncpg ends the password at the first ``@``. Percent-encoded, they connect."""
    d = doc()
    d["spec"]["source"] = {"type": "postgres", "config": {"id": "pg", "dsn": dsn}}
    errs = errors_of(d)
    assert errs == [f"spec.source.config.dsn: expected postgresql://user:password@host:port/db: {problem}"]
    assert not any(part in e for e in errs for part in ("hun", "ter2"))
    d["spec"]["source"]["config"]["dsn"] = "postgresql://cdc:hun%2Fter2%40%3F@db:5432/shop"
    assert parse_pipeline(d, env={}).source.config.dsn.endswith("@db:5432/shop")  # type: ignore[attr-defined]
    mysql = {"type": "mysql", "config": {"id": "m", "dsn": "mysql://cdc:hun@ter2@db:3306/shop"}}
    d["spec"]["source"] = mysql  # the MySQL source reads the password up to the last '@'
    assert parse_pipeline(d, env={}).source.type == "mysql"


def test_addresses_drivers_take_are_accepted(tmp_path: Path) -> None:
    """Several hosts in one PostgreSQL DSN (libpq's and asyncpg's failover list), a socket folder
    as ``?host=``, an IPv6 host, an '@' in a query parameter (Azure's ``user@server``), a broker list with a protocol, several NATS servers; two
    pipelines on one multi-host database and slot are still refused as one (not a traceback)."""
    dsns = ["postgresql://u:p@db1:5432,db2:5433/app", "postgresql:///app?host=/var/run/postgresql",
            "postgresql://u:p@[::1]:5432/app", "postgresql://db/app?user=cdc@eu-server&sslmode=require",
            "postgresql://db:5432/app?application_name=cdc@eu"]  # fmt: skip
    for dsn in dsns:
        d = doc(name="orders")
        d["spec"]["source"] = {"type": "postgres", "config": {"id": "pg", "dsn": dsn}}
        d["spec"]["sinks"] = [
            {"type": "kafka", "config": {"id": "k", "brokers": "PLAINTEXT://k1:9092,k2", "topic": "t"}},
            {"type": "nats", "config": {"id": "n", "url": "nats://a,tls://[::1]:4223", "subject": "s"}},
        ]
        assert parse_pipeline(d, env={}).source.config.dsn == dsn  # type: ignore[attr-defined]
    docs = [doc(name=name) for name in ("orders", "billing")]
    for d in docs:
        d["spec"]["source"] = {"type": "postgres", "config": {"id": d["metadata"]["name"], "dsn": dsns[0]}}
    (tmp_path / "p.yaml").write_text("---\n".join(yaml.safe_dump(d) for d in docs))
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, env={})
    assert [e.split(":")[0] for e in refused.value.errors] == ["spec.source.config.slot"]
    assert "(db1:5432,db2:5433/app)" in refused.value.errors[0]


def test_a_pipeline_name_the_rest_api_cannot_be_asked_about_is_refused() -> None:
    """``/pipelines/{name}``: a '/' in a name, even encoded, is read as the path's own, so such a
    pipeline could be neither read, paused nor deleted over REST or the CLI."""
    assert errors_of(doc(name="orders/eu")) == [
        "metadata.name: expected a name without '/' or control characters (it is a path segment of the REST "
        "API), got 'orders/eu'"
    ]
    assert parse_pipeline(doc(name="orders #2? eu"), env={}).name == "orders #2? eu"


def test_a_config_file_with_no_pipeline_in_it_is_refused(tmp_path: Path) -> None:
    """An empty file (a deploy that truncated it) or one of comments only: ``validate`` said
    nothing and exited 0, and ``serve`` ran no pipeline at all, with nothing said of it."""
    empty, comments = tmp_path / "a.yaml", tmp_path / "b.yaml"
    empty.write_text("")
    comments.write_text("# orders, to be written\n---\n")
    with pytest.raises(ConfigError) as refused:
        load(empty, env={})
    assert refused.value.errors == [f"{empty}: no pipeline in it (the file is empty, or holds only comments)"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc(name="orders")))
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, env={})
    assert refused.value.errors == [
        f"{empty}: no pipeline in it (the file is empty, or holds only comments)",
        f"{comments}: no pipeline in it (the file is empty, or holds only comments)",
    ]
    validated = subprocess.run([sys.executable, "-m", "deltaforge", "validate", str(empty)],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
    assert validated.returncode == 1 and "no pipeline in it" in validated.stderr


def test_sinks_given_as_something_else_than_a_list_say_what_was_given() -> None:
    """A mapping where the list goes (one sink written without its dash) was told ``required``."""
    d = doc()
    d["spec"]["sinks"] = {"type": "stdout", "config": {"id": "o"}}
    assert errors_of(d) == ["spec.sinks: expected a non-empty list of sinks, got dict"]
    d["spec"]["sinks"] = []
    assert errors_of(d) == ["spec.sinks: expected a non-empty list of sinks, got an empty list"]
    del d["spec"]["sinks"]
    assert errors_of(d) == ["spec.sinks: required (a non-empty list of sinks)"]
