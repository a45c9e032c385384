"""What a librdkafka error means for a Kafka sink's batch: the event's fault (to the DLQ), a
refusal no retry fixes, a stop (another producer took over), or a retry, with a new producer
when the one that failed is finished; and the reports of why heard while a transactional call
waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer

from deltaforge.sinks.base import NonRetryableSinkError, PoisonEvent, RetryableSinkError
from supervision import Fatal

POISON = {  # the event's fault: to the DLQ, with this kind
    KafkaError.MSG_SIZE_TOO_LARGE: "too_large",
    KafkaError.INVALID_RECORD: "invalid_record",
    KafkaError.TOPIC_EXCEPTION: "routing",  # an invalid topic name: a template produced it
}
NON_RETRYABLE = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._AUTHENTICATION,
}
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
_TIMED_OUT = KafkaError._MSG_TIMED_OUT
_UNREACHED = {_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT}
"""Errors that say only that no broker answered in time: told with what librdkafka last reported."""


class Reports:
    """A producer's error reports (``error_cb``) since its last batch went through: what a batch
    that timed out was waiting on (a name that does not resolve, a refused connection), told with
    its error, which says only that time ran out."""

    def __init__(
        self, also: Callable[[KafkaError], None] | None = None, down: Callable[[str], None] | None = None
    ) -> None:
        self.last: KafkaError | None = None
        self.also = also
        """Told of every report too (a default-mode sink's partition ends: were they kept?)."""
        self.down = down
        """Told when no broker is reachable, with :meth:`said` (the sink's ``unreachable``)."""

    def hear(self, err: KafkaError) -> None:
        """ "All brokers are down" says less than the report before it (the lookup or the
        connection that failed), so it is kept only when it is all there is."""
        all_down = err.code() == KafkaError._ALL_BROKERS_DOWN
        if not all_down or self.last is None:
            self.last = err
        if self.also is not None:
            self.also(err)
        if all_down and self.down is not None:
            self.down(self.said())

    def said(self) -> str:
        last = self.last
        return "" if last is None else f"; librdkafka last said: {last.name()}: {last.str()}"

    def clear(self) -> None:
        self.last = None


SLICE_S = 1.0
"""How long a transactional call waits before the producer's reports are served (:func:`resumed`)."""


def resumed(producer: Producer, call: Callable[[float], object], timeout: float) -> None:
    """``call`` (``init_transactions``, ``commit_transaction``: librdkafka resumes either where a
    timeout left it) for up to ``timeout`` seconds, in slices of :data:`SLICE_S` with the
    producer's reports served between them. Such a call serves none while it waits for the
    broker's answer: a broker gone during a commit was heard ("all brokers down") only once the
    whole ``timeout`` had passed, and the sink listed as unanswered instead of unreachable
    meanwhile. The last slice's error is raised."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            call(min(SLICE_S, max(left, 0.0)))
            return
        except KafkaException as exc:
            producer.poll(0)
            if exc.args[0].code() != KafkaError._TIMED_OUT or left <= SLICE_S:
                raise


@dataclass(frozen=True)
class Verdict:
    """The batch's error, and what the sink does about its producer before the retry."""

    error: Exception
    new_producer: bool = False
    """The producer is finished: the retry starts another."""
    forgave_fence: bool = False
    """A fence right after reconnecting was taken for our own old epoch's (once per reconnect)."""


def classify(
    err: KafkaError, sink: str, exactly_once: bool, reopened: bool, transactional_id: str, said: str = ""
) -> Verdict:
    """``reopened``: the producer was made after a close (an outage, a restart of the worker);
    ``said``: what librdkafka reported before, told with records that timed out."""
    code = err.code()
    text = f"kafka sink {sink!r}: {err.name()}: {err.str()}{said if code in _UNREACHED else ''}"
    if exactly_once and reopened and code in FENCED:
        # Our own transaction from before the outage, timed out by the broker, bumped the
        # epoch after this producer's init: start once more (a real rival fences us again).
        return Verdict(RetryableSinkError(f"{text} (right after reconnecting: producer recreated once)"),
                       new_producer=True, forgave_fence=True)  # fmt: skip
    if exactly_once and (code in FENCED or err.fatal()):
        return Verdict(Fatal(f"{text} (another producer with transactional.id {transactional_id!r}?)"))
    if err.fatal() or code in FENCED or (code == _TIMED_OUT and not exactly_once):
        # An idempotent producer's fatal state (e.g. the broker lost its producer id after a
        # restart) ends that producer only: start a new one and retry the batch. So does a
        # fence: after its messages time out librdkafka bumps the epoch, and Tansu then
        # fences every produce of that producer; without a transactional id no rival exists.
        # So do records that timed out: a producer whose id the broker no longer knows (one
        # back without its data) bumps its epoch and sends again under that id until they
        # time out, at every retry (Tansu refuses each bumped epoch as UNKNOWN_PRODUCER_ID).
        return Verdict(RetryableSinkError(f"{text} (producer recreated)"), new_producer=True)
    if code in POISON:
        return Verdict(PoisonEvent(text, POISON[code]))
    if code in NON_RETRYABLE:
        return Verdict(NonRetryableSinkError(text))
    return Verdict(RetryableSinkError(text))
