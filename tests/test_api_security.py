"""The API's safety (issue 16, acceptance 4): changes need the bearer token when one is set,
serve will not listen beyond loopback without one, and no password reaches an API response or
a log line."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaforge.api import build_app
from deltaforge.api.listen import unsafe_bind
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.redact import redact
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until_sync
from tests.kit import SyntheticSource, config, sink_doc
from tests.serve_proc import serve_pipeline
from tests.servers.mariadb import CDC_PASSWORD, MariaDB
from tests.servers.postgres import Postgres

PG_PASSWORD = "pg-secret-pw"  # the test server trusts every login: any password connects


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("mysql://cdc:s3cret@db:3306/shop", "mysql://cdc:***@db:3306/shop"),
        (
            '{"reason": "postgresql://u:p%40ss@h:5432/db refused"}',
            '{"reason": "postgresql://u:***@h:5432/db refused"}',
        ),
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("host=db password=s3cret dbname=app", "host=db password=*** dbname=app"),
        ("nats://nats:4222 and mysql://cdc@db/shop", "nats://nats:4222 and mysql://cdc@db/shop"),
        # librdkafka settings a Kafka sink passes on (``producer:``), as JSON and a dict repr; an
        # unquoted ``key:`` is how an error names a field, and stays
        ('{"sasl.password": "s3cret", "acks": "all"}', '{"sasl.password": "***", "acks": "all"}'),
        ('{"ssl.key.password":1234}', '{"ssl.key.password":"***"}'),
        ("spec.sinks[0].config.password: unknown field", "spec.sinks[0].config.password: unknown field"),
        ("{'sasl.oauthbearer.client.secret': 's3cret'}", "{'sasl.oauthbearer.client.secret': '***'}"),
        ("password_hash: abc", "password_hash: abc"),
    ],
)
def test_redact_masks_passwords_and_nothing_else(text: str, shown: str) -> None:
    assert redact(text) == shown


@settings(max_examples=300, deadline=None)
@given(
    secret=st.one_of(st.text(min_size=1), st.integers()),
    key=st.sampled_from(["password", "sasl.password", "ssl.key.password", "client_secret", "PWD"]),
    depth=st.integers(0, 2),
)
def test_a_secret_setting_is_masked_in_json_at_any_depth_and_in_a_repr(
    secret: str | int, key: str, depth: int
) -> None:
    """API responses and log lines are JSON, perhaps with JSON or a dict's repr inside a string
    (an error message): the value is masked whatever it holds, and the text still parses."""
    doc = {"producer": {key: secret, "acks": "all"}}
    text = json.dumps(doc)
    for _ in range(depth):
        text = json.dumps({"message": text})
    shown = redact(text)
    for _ in range(depth):
        shown = json.loads(shown)["message"]
    assert json.loads(shown) == {"producer": {key: "***", "acks": "all"}}
    assert ast.literal_eval(redact(repr(doc))) == {"producer": {key: "***", "acks": "all"}}


@settings(max_examples=300, deadline=None)
@given(
    password=st.text(
        st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="\"'\\"), min_size=1
    ),
    scheme=st.sampled_from(["mysql", "postgresql", "redis", "nats"]),
)
def test_a_password_in_a_url_is_masked_whatever_it_holds(password: str, scheme: str) -> None:
    """A password written into a DSN as typed, not percent-encoded (``p@ss``, ``pa/ss``): drivers
    take the userinfo up to the last ``@``, so such a DSN connects, and its log lines and errors
    showed the password's end (``cdc:***@ss@db``) or all of it."""
    text = f"connecting to {scheme}://cdc:{password}@db:5432/shop failed, and nats://n:{password}@h:4222,nats://h2:4222"
    assert (
        redact(text)
        == "connecting to "
        + f"{scheme}://cdc:***@db:5432/shop failed, and nats://n:***@h:4222,nats://h2:4222"
    )


@pytest.mark.parametrize("scheme", ["nats", "tls"])
def test_a_nats_token_in_a_url_is_masked(scheme: str) -> None:
    """NATS takes a token as the URL's user (``nats://s3cr3t@host:4222``): it is the secret."""
    assert redact(f"{scheme}://s3cr3t@nats:4222 refused") == f"{scheme}://***@nats:4222 refused"


def test_only_loopback_is_served_without_a_token() -> None:
    for addr in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", ":8080"):
        assert unsafe_bind(addr, None) is None, addr
    assert "DELTAFORGE_API_TOKEN" in (unsafe_bind("0.0.0.0:8080", None) or "")
    assert unsafe_bind("0.0.0.0:8080", "t0ken") is None
    proc = subprocess.run([sys.executable, "-m", "deltaforge", "serve", "--api-addr", "0.0.0.0:0"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "is not a loopback address" in proc.stderr


async def test_changes_need_the_token_reads_do_not() -> None:
    runner = PipelineRunner(
        config(sinks=[sink_doc("a")]), store=MemoryCheckpointStore(), source=SyntheticSource(1)
    )
    app = build_app({"t": runner}, token="t0ken")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://df") as client:
        url = "/pipelines/t/journal/dlq/ack"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "t0ken"}):
            resp = await client.post(url, json={"up_to": 1}, headers=headers)
            assert resp.status_code == 401 and resp.json()["code"] == "unauthorized"
        ok = await client.post(url, json={"up_to": 1}, headers={"Authorization": "Bearer t0ken"})
        assert ok.status_code == 200 and ok.json() == {"acked": 0}
        assert (await client.delete("/pipelines/t/journal/dlq")).status_code == 401
        assert (await client.get("/pipelines/t/journal/dlq/count")).status_code == 200
        assert (await client.get("/health")).status_code == 200


def test_no_password_in_any_response_or_log_line(
    tmp_path: Path, mariadb: MariaDB, postgres: Postgres
) -> None:
    """MariaDB and PostgreSQL DSNs with passwords, a poison row in the DLQ, a sink that fails:
    every GET endpoint and every log line is searched for both passwords."""
    with mariadb.root() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS sec")
        cur.execute("CREATE TABLE IF NOT EXISTS sec.items (id INT PRIMARY KEY, seq INT)")
    db = "sec_" + tmp_path.name[-12:].lower().replace("-", "_")
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}".encode())
    with psycopg.connect(postgres.dsn(db), autocommit=True) as conn:
        conn.execute(b"CREATE TABLE items (id int PRIMARY KEY, seq int CHECK (seq <> 3), _df_position text)")
    target = postgres.dsn(db).replace("postgres@", f"postgres:{PG_PASSWORD}@")
    nowhere = f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:1/none"
    spec = {
        "source": {
            "type": "mysql",
            "config": {"id": "my", "dsn": mariadb.dsn("sec"), "tables": ["sec.items"]},
        },
        "sinks": [
            {"type": "postgres", "config": {"id": "pg", "dsn": target, "key_columns": ["id"]}},
            {
                "type": "postgres",
                "config": {"id": "down", "dsn": nowhere, "key_columns": ["id"], "required": False},
            },
        ],
        "journal": {"enabled": True},
        "batch": {"max_events": 1, "max_ms": 10},
        "storage": {"type": "sqlite", "path": str(tmp_path / "cp.db")},
    }
    assert CDC_PASSWORD in mariadb.dsn("sec")
    with serve_pipeline(tmp_path, spec, env={"DELTAFORGE_API_TOKEN": "t0ken"}) as serve:
        with mariadb.root("sec") as conn, conn.cursor() as cur:
            for i in range(1, 6):
                cur.execute("INSERT INTO items VALUES (%s, %s)", (i, i))
        wait_until_sync(lambda: serve.get("/pipelines/shop/journal/dlq/count").json()["count"] == 1,
                        timeout=60, what="the refused row in the DLQ")  # fmt: skip
        wait_until_sync(
            lambda: "sink:down" in str(serve.get("/health").json()), timeout=60, what="a sink down"
        )
        assert httpx.delete(serve.url("/pipelines/shop/journal/dlq")).status_code == 401
        bodies = [
            serve.get(path).text
            for path in (
                "/health", "/ready", "/pipelines", "/pipelines/shop", "/pipelines/shop/actors",
                "/pipelines/shop/checkpoints", "/pipelines/shop/identity", "/pipelines/shop/reconcile",
                "/pipelines/shop/schemas", "/pipelines/shop/schemas/sec.items/versions",
                "/pipelines/shop/journal/dlq", "/pipelines/shop/journal/dlq/count", "/metrics",
            )
        ]  # fmt: skip
        assert "sink:down" in bodies[0] and '"kind":"rejected"' in bodies[10].replace(" ", "")
        assert serve.terminate() == 0
    log = (tmp_path / "log.jsonl").read_text()
    assert "delivery_failed" in log or "unavailable" in log  # the failing sink was logged
    for text in [*bodies, log]:
        assert CDC_PASSWORD not in text and PG_PASSWORD not in text
