"""Poison events against real servers (issue 16, acceptance 2): an oversized Kafka record and a
key template that does not resolve for one row (Tansu), and a row a PostgreSQL target's
constraint refuses, replayed once the target is fixed."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson

from deltaforge.config import parse_pipeline
from deltaforge.events import Event, with_images
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.checkpoints import MemoryCheckpointStore
from tests.helpers import wait_until
from tests.kit import SyntheticSource, make_event, sink_pipeline
from tests.servers.postgres import Postgres
from tests.servers.redis import Redis
from tests.servers.tansu import Tansu
from tests.test_kafka_sink import consume, kafka_doc
from tests.test_postgres_sink import _reader_up, pg_doc, rows, target

JOURNAL = {"enabled": True}


class OddSource(SyntheticSource):
    """Every row has a ``code`` column except ``missing``; ``huge`` carries a 5 KB payload."""

    def __init__(self, total: int, missing: int = 0, huge: int = 0) -> None:
        super().__init__(total, chunk=1000)
        self.missing, self.huge = missing, huge

    async def read(self) -> list[Event]:
        out = []
        for e in await super().read():
            seq = e.order[0]
            if seq == self.huge:
                e = make_event(seq, payload="x" * 5000)
            after = dict(e.after or {})
            if seq != self.missing:
                after["code"] = f"c{seq % 10}"
            out.append(with_images(e, e.op, None, after))
        return out


async def drain(doc: dict[str, Any], source: SyntheticSource, n: int) -> PipelineRunner:
    doc["spec"]["journal"] = JOURNAL
    runner = PipelineRunner(parse_pipeline(doc, env={}), store=MemoryCheckpointStore(), source=source)
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.ctx.stats.events_committed >= n, timeout=60, what="every batch committed")
    await runner.drain()
    await task
    return runner


async def test_an_oversized_record_and_an_unresolvable_key_go_to_the_dlq_the_rest_in_order(
    tansu: Tansu,
) -> None:
    n = 10_000
    tansu.create_topic("cdc.t", partitions=1)
    doc = kafka_doc(tansu.bootstrap, key="${after.code}", producer={"message.max.bytes": 2000})
    runner = await drain(doc, OddSource(n, missing=3_333, huge=6_666), n)
    assert runner.ctx.dlq is not None
    entries = await runner.ctx.dlq.show(_all())
    assert [(e["position"]["seq"], e["kind"]) for e in entries] == [(3_333, "routing"), (6_666, "too_large")]
    assert "${after.code} does not resolve" in entries[0]["error"]
    assert "MSG_SIZE_TOO_LARGE" in entries[1]["error"]
    got = [int(d["event_id"]) for _, _, d, _ in consume(tansu.bootstrap, "cdc.t", n - 2)]
    assert got == [s for s in range(1, n + 1) if s not in (3_333, 6_666)]  # in order, nothing twice


async def test_a_row_the_target_refuses_goes_to_the_dlq_and_replays_once_fixed(postgres: Postgres) -> None:
    n, poison = 10_000, 9_995  # the last change of its key (id 4)
    db = await target(
        postgres, "CREATE TABLE t (id int PRIMARY KEY, seq int CHECK (seq <> 9995), _df_position text)"
    )
    dsn = postgres.dsn(db)
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "CREATE TABLE applied (seq int);"
        "CREATE FUNCTION log_seq() RETURNS trigger AS $$ BEGIN INSERT INTO applied VALUES (NEW.seq); RETURN NEW; END $$ "
        "LANGUAGE plpgsql; CREATE TRIGGER log AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION log_seq()"
    )
    runner = await drain(pg_doc(dsn), SyntheticSource(n, chunk=2000), n)
    dlq = runner.ctx.dlq
    assert dlq is not None
    [entry] = await dlq.show(_all())
    assert (
        entry["kind"] == "rejected"
        and entry["position"] == {"seq": poison}
        and "CheckViolation" in entry["error"]
    )
    assert await rows(dsn, "SELECT seq FROM t WHERE id = 4") == [(9_898,)]  # 9,995 refused
    await conn.execute("ALTER TABLE t DROP CONSTRAINT t_seq_check")
    # Replay needs the pipeline's worker: run it again (nothing new to read) and replay over it.
    again = PipelineRunner(runner.config, store=runner.store, source=SyntheticSource(n, chunk=2000))
    task = asyncio.create_task(again.run())
    await wait_until(lambda: _reader_up(again), what="the pipeline up (its workers start before the reader)")
    assert await again.replay_dead_letters(_all()) == 1
    assert await again.replay_dead_letters(_all()) == 0
    await again.drain()
    await task
    assert await rows(dsn, "SELECT seq FROM t WHERE id = 4") == [(poison,)]
    assert await rows(dsn, f"SELECT count(*) FROM applied WHERE seq = {poison}") == [(1,)]  # exactly once
    await conn.close()


def _all() -> Any:
    from deltaforge.state.deadletters import Select

    return Select()


async def test_a_dead_letter_replayed_into_a_redis_stream_exactly_once_is_written(
    redis_server: Redis,
) -> None:
    """A Redis ``exactly_once`` stream writes only entries past its watermark, and a dead letter
    is older than the changes delivered after it: replayed, it was skipped as written already,
    and acked, gone from the queue and never in the stream. (Here the stream name the template
    could not render is fixed in the config, as a user would before replaying.)"""
    n, poison = 2_000, 1_234
    doc = sink_pipeline("r", "redis", {"id": "r", "uri": redis_server.uri(), "stream": "cdc.${after.code}",
                                       "exactly_once": True})  # fmt: skip
    runner = await drain(doc, OddSource(n, missing=poison), n)
    assert runner.ctx.dlq is not None and runner.ctx.dlq.added == 1
    doc["spec"]["sinks"][0]["config"]["stream"] = "cdc.fixed"
    # ten newer changes go to the new stream first, then the dead letter is replayed
    again = PipelineRunner(parse_pipeline(doc, env={}), store=runner.store, source=OddSource(n + 10))
    task = asyncio.create_task(again.run())
    await wait_until(lambda: again.ctx.stats.events_committed >= 10, what="the ten newer changes delivered")
    assert await again.replay_dead_letters(_all()) == 1
    await again.drain()
    await task
    written = [orjson.loads(f[b"event"])["event_id"] for _, f in redis_server.client().xrange("cdc.fixed")]
    assert written == [str(s) for s in range(n + 1, n + 11)] + [str(poison)]
