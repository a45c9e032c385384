"""FailoverReconciler: which server is behind the DSN, and can reading resume there?

Asked by the SourceReader before every opening of the source (start and each
reconnect), so no event flows from a server before it has been reconciled:

1. The source reports the server's identity (MySQL ``server_uuid``; MariaDB
   ``server_id``; PostgreSQL ``system_identifier`` and timeline). Compared with
   the identity stored beside the checkpoints: FirstSeen, Same or Changed.
2. With a checkpoint, the source checks it is reachable on this server
   (:meth:`Source.reconcile`): lost halts the pipeline (``position lost: …
   Re-snapshot required.``); undeterminable is a warning, never a halt.
3. On Changed, the schemas last recorded are compared with the new server's tables
   (``drift.py``): drift is recorded, then adapted to (the source decodes with the
   server's catalog) or, with ``on_schema_drift: halt``, halts the pipeline.
4. A Changed outcome is recorded (a ReconcileRecord) *before* the new identity is
   stored, with a new failover generation: killed in between, the next start finds
   Changed again, redoes the same checks and rewrites the same records, so each is
   recorded once.

The reader waits for the answer as long as it takes. What the server is asked is bounded here
(``ANSWER_TIMEOUT_S``: a server that does not answer is unavailable, and waited for); the
writes to the state store are not, since they wait out a full disk (``storewait.py``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar, cast

import anyio

from actors import Actor, Ask, message
from deltaforge.pipeline.context import PipelineContext
from deltaforge.pipeline.drift import HALT_MESSAGE, describe, schema_drift
from deltaforge.pipeline.storewait import PatientWrites
from deltaforge.position import Position, PositionDoc, as_int
from deltaforge.sources.base import PositionLost, SourceMisconfigured, Undeterminable
from supervision import Unavailable

Outcome = Literal["none", "first_seen", "same", "changed"]
T = TypeVar("T")

ANSWER_TIMEOUT_S = 120.0
"""How long the reconciler waits for the server to answer one of its questions."""


def identity_key(source_id: str) -> str:
    return f"{source_id}::identity"


def record_key(source_id: str, old: dict[str, str], new: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps([old, new], sort_keys=True).encode()).hexdigest()[:16]
    return f"{source_id}::reconcile::{digest}"


@message
class Reconcile(Ask[Outcome | Exception]):
    """Reader to reconciler: about to open the source after ``resume`` (None: from the start).
    The reply is the outcome, or the error for the reader to raise (position lost, server down):
    the reader's failure, not this actor's."""

    resume: Position | None


class FailoverReconciler(Actor):
    """Identifies the server behind the DSN before each opening of the source; see the module."""

    mailbox_size = 2

    def __init__(self, ctx: PipelineContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.patient = PatientWrites(ctx)

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Reconcile):
            try:
                return await self._reconcile(message.resume)
            except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
                return exc
        return await super().receive(message)

    async def on_start(self) -> None:
        # What REST shows, also once the pipeline has stopped (its store is closed then).
        ctx = self.ctx
        stored = await ctx.store.get(identity_key(ctx.source.id))
        ctx.identity = _fields(stored)
        ctx.source.generation = as_int(stored, "generation") if stored is not None else 0
        prefix = f"{ctx.source.id}::reconcile::"
        listed = await ctx.store.list_all()
        records = [{**doc, "key": key} for key, (_, _, doc) in listed.items() if key.startswith(prefix)]
        ctx.reconcile_records = sorted(records, key=lambda r: float(str(r.get("at") or 0)))

    async def _reconcile(self, resume: Position | None) -> Outcome:
        ctx, source = self.ctx, self.ctx.source
        try:
            current = await self._asked(source.identity())
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - never halt on uncertainty
            self.log.warning(
                "identity_undeterminable", source=source.id, reason=f"{type(exc).__name__}: {exc}"
            )
            return "none"
        if current is None:
            return "none"
        known = ctx.identity
        outcome: Outcome = "first_seen" if known is None else "same" if known == current else "changed"
        if outcome == "changed":
            self.log.warning("failover_detected", source=source.id, previous=known, now=current)
        result, reason = "reachable", ""
        lost: Exception | None = None
        if resume is not None:
            try:
                await self._asked(source.reconcile(resume, known if outcome == "changed" else None))
            except Undeterminable as exc:
                result, reason = "undeterminable", str(exc)
                self.log.warning("position_undeterminable", source=source.id, reason=reason)
            except (PositionLost, SourceMisconfigured) as exc:
                result = "position_lost" if isinstance(exc, PositionLost) else "refused"
                reason, lost = str(exc), exc
                self.log.error("position_unreachable", source=source.id, reason=reason, outcome=outcome)
        previous = known or current
        if outcome == "changed" or lost is not None:
            kind = "failover" if outcome == "changed" else "same_server"
            await self._record(kind, previous, current, result, reason, resume)
        if outcome == "changed" and lost is None:
            lost = await self._check_drift(previous, current, resume)
        if lost is not None:
            raise lost
        if outcome != "same":
            # A failover starts a new generation, stored with the identity in one write: killed
            # before it, the next start finds Changed again; after it, Same with the new generation.
            generation = source.generation + (outcome == "changed")
            doc: PositionDoc = {"fields": dict(current), "generation": generation, "seen_at": time.time()}
            await self.patient(lambda: ctx.store.put(identity_key(source.id), doc))
            ctx.identity, source.generation = current, generation
            self.log.info(
                "identity_stored", source=source.id, identity=current, outcome=outcome, generation=generation
            )
        return outcome

    async def _check_drift(
        self, previous: dict[str, str], now: dict[str, str], resume: Position | None
    ) -> Exception | None:
        """Schema drift on the new server: recorded; the error to halt with under ``halt``."""
        source = self.ctx.source
        try:
            drift = await self._asked(schema_drift(self.ctx.store, source))
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - never halt on uncertainty
            self.log.warning(
                "schema_drift_undeterminable", source=source.id, reason=f"{type(exc).__name__}: {exc}"
            )
            return None
        if not drift:
            return None
        halt = source.on_schema_drift == "halt"
        self.log.warning("schema_drift", source=source.id, drift=drift, policy=source.on_schema_drift)
        result = "halted" if halt else "adapted"
        await self._record(
            "schema_drift",
            previous,
            now,
            result,
            describe(drift),
            resume,
            cast(PositionDoc, {"drift": drift}),
        )
        return SourceMisconfigured(f"{HALT_MESSAGE} ({describe(drift)})") if halt else None

    async def _record(
        self, kind: str, previous: dict[str, str], now: dict[str, str], result: str, reason: str,
        resume: Position | None, extra: PositionDoc | None = None,
    ) -> None:  # fmt: skip
        """A ReconcileRecord, keyed by its kind and the pair of identities: a rerun rewrites the same one."""
        record: PositionDoc = {
            "kind": kind,
            "previous": dict(previous),
            "now": dict(now),
            "result": result,
            "reason": reason,
            "checkpoint": resume.to_doc() if resume is not None else None,
            "at": time.time(),
            **(extra or {}),
        }
        key = record_key(self.ctx.source.id, previous, now)
        if kind == "schema_drift":
            key += "::drift"
        await self.patient(lambda: self.ctx.store.put(key, record))
        records = [r for r in self.ctx.reconcile_records if r.get("key") != key]
        self.ctx.reconcile_records = [*records, {**record, "key": key}]

    async def _asked(self, question: Awaitable[T]) -> T:
        """``question`` to the source's server, answered within ANSWER_TIMEOUT_S or unavailable."""
        try:
            with anyio.fail_after(ANSWER_TIMEOUT_S):
                return await question
        except TimeoutError:
            raise Unavailable(
                f"source {self.ctx.source.id!r}: the server did not answer the reconciler "
                f"within {ANSWER_TIMEOUT_S:g} s"
            ) from None


def _fields(doc: PositionDoc | None) -> dict[str, str] | None:
    fields = doc.get("fields") if doc is not None else None
    if not isinstance(fields, dict):
        return None
    return {str(k): str(v) for k, v in fields.items()}
