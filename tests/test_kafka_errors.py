"""What a librdkafka error means for a Kafka sink's batch (``deltaforge/sinks/kafka_errors.py``).

``tests/test_kafka_sink.py`` tests the sink against a real broker through the errors Tansu can
be made to give (an outage, a lost producer id, a rival producer, a record too large). This
table holds the whole decision, with the rows no broker here gives (authorisation failures)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from deltaforge.sinks.base import NonRetryableSinkError, PoisonEvent, RetryableSinkError
from deltaforge.sinks.kafka_errors import classify
from supervision import Fatal

FENCED = KafkaError._FENCED
TIMED_OUT = KafkaError._MSG_TIMED_OUT


@pytest.mark.parametrize(
    ("code", "fatal", "exactly_once", "reopened", "expected", "new_producer", "forgave"),
    [
        # exactly_once: a fence is another producer with our transactional.id, unless it comes
        # right after reconnecting (our own old epoch, timed out by the broker): then once more
        (FENCED, False, True, False, Fatal, False, False),
        (KafkaError.PRODUCER_FENCED, False, True, False, Fatal, False, False),
        (FENCED, False, True, True, RetryableSinkError, True, True),
        (KafkaError.UNKNOWN_PRODUCER_ID, True, True, False, Fatal, False, False),
        # the default mode: no rival exists; a finished producer is replaced and the batch retried
        (FENCED, False, False, False, RetryableSinkError, True, False),
        (KafkaError.UNKNOWN_PRODUCER_ID, True, False, False, RetryableSinkError, True, False),
        (TIMED_OUT, False, False, False, RetryableSinkError, True, False),
        (TIMED_OUT, False, True, False, RetryableSinkError, False, False),
        # the event's fault, whatever the mode
        (KafkaError.MSG_SIZE_TOO_LARGE, False, False, False, PoisonEvent, False, False),
        (KafkaError.TOPIC_EXCEPTION, False, True, False, PoisonEvent, False, False),
        # refused: no retry fixes it
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, False, False, False, NonRetryableSinkError, False, False),
        (KafkaError._AUTHENTICATION, False, True, False, NonRetryableSinkError, False, False),
        # anything else: the broker away, a leader moving
        (KafkaError._TRANSPORT, False, False, False, RetryableSinkError, False, False),
        (KafkaError.NOT_LEADER_FOR_PARTITION, False, True, True, RetryableSinkError, False, False),
    ],
)
def test_each_error_is_retried_refused_poison_or_a_stop_and_says_whether_the_producer_goes(
    code: int, fatal: bool, exactly_once: bool, reopened: bool, expected: type[Exception],
    new_producer: bool, forgave: bool,
) -> None:  # fmt: skip
    verdict = classify(
        KafkaError(code, "what the broker said", fatal=fatal), "k", exactly_once, reopened, "df-p-k"
    )
    assert type(verdict.error) is expected
    assert (verdict.new_producer, verdict.forgave_fence) == (new_producer, forgave)
    assert str(verdict.error).startswith("kafka sink 'k': ")
    assert "what the broker said" in str(verdict.error)


def test_a_poison_record_says_its_kind_for_the_dlq() -> None:
    kinds = {
        code: classify(KafkaError(code), "k", False, False, "t").error
        for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.TOPIC_EXCEPTION)
    }
    assert {code: error.kind for code, error in kinds.items() if isinstance(error, PoisonEvent)} == {
        KafkaError.MSG_SIZE_TOO_LARGE: "too_large",
        KafkaError.INVALID_RECORD: "invalid_record",
        KafkaError.TOPIC_EXCEPTION: "routing",
    }


def test_a_stop_names_the_transactional_id_another_producer_may_hold() -> None:
    error = classify(KafkaError(FENCED), "k", True, False, "deltaforge-shop-k").error
    assert isinstance(error, Fatal)
    assert "'deltaforge-shop-k'" in str(error)
