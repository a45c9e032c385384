"""``spec.source.config`` of a Kafka source."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from deltaforge.configmodel import Brokers, Hint, PositiveInt, SourceSettings, Text, fail

FORMATS = ("debezium", "native", "cloudevents", "raw")


def _topics(value: Any) -> list[str] | str:
    """A list of topic names, or one string: a name, or ``/regex/`` (subscribed by pattern)."""
    if isinstance(value, str) and value.strip():
        if value.startswith("/") and value.endswith("/") and len(value) > 2:
            try:
                re.compile(value[1:-1])
            except re.error as exc:
                fail(f"expected a valid /regex/ of topic names, got {value!r} ({exc})")
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return list(value)
    fail(f"expected a list of topic names or a /regex/, got {value!r}")


Topics = Annotated[list[str] | str, BeforeValidator(_topics), Hint("a list of topic names or a /regex/")]


class KafkaSourceConfig(SourceSettings):
    """Topics of a Kafka broker, read by a consumer group whose offsets move only after delivery."""

    brokers: Brokers = Field(description="bootstrap servers: host:port[,host:port...]")
    topics: Topics = Field(description='Topic names, or one "/regex/" matching topic names.')
    group_id: Text = Field(
        description="The consumer group: its committed offsets follow what every sink holds."
    )
    format: Literal["debezium", "native", "cloudevents", "raw"] = Field(
        "debezium",
        description="debezium/native/cloudevents: JSON change envelopes parsed back into row changes; "
        "raw: each record's key, value and headers as they are.",
    )
    start: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a partition with no checkpoint and no committed offset starts."
    )
    max_records: PositiveInt = Field(5000, description="Records fetched per read.")
    poll_ms: PositiveInt = Field(100, description="How long a read waits for records when none are there.")
    session_timeout_ms: PositiveInt = Field(
        10_000,
        description="The group session timeout: how long the broker waits for a member that stopped "
        "answering (a killed one) before its partitions go to another, or to it again after a restart.",
    )

    @property
    def pattern(self) -> str | None:
        """The regex of a ``/regex/`` subscription, else None."""
        t = self.topics
        return (
            t[1:-1] if isinstance(t, str) and t.startswith("/") and t.endswith("/") and len(t) > 2 else None
        )

    @property
    def topic_names(self) -> list[str]:
        t = self.topics
        return [t] if isinstance(t, str) else list(t)
