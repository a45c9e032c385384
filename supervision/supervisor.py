"""The Supervisor: starts children, watches them, restarts them by policy."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Sequence
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from actors.snapshot import NodeSnapshot
from supervision.backoff import Backoff
from supervision.clock import Clock, MonotonicClock
from supervision.errors import Fatal, SupervisorFailed, Unavailable
from supervision.intensity import Intensity, RestartIntensity
from supervision.running import Exited, Running, Started, describe, reason_kind
from supervision.spec import ChildSpec, Restart, Strategy

_STOP = object()
"""Put in the exits queue by :meth:`Supervisor.request_stop`."""


class Supervisor:
    """Runs children and applies a restart strategy when they end.

    Children start one at a time, in order, and each must report that it is up
    (``task_status.started()``; an actor does after ``on_start``) before the next
    one starts: OTP's start_link. So a child may rely on every child before it
    being ready, with no readiness events or polling. A restart starts its group
    again the same way.

    Every crash, restart, escalation and fatal stop is logged with the
    exception's traceback (``exc_info``).

    A child that exits with :class:`Unavailable` is not counted as a crash: it is
    restarted with its own capped backoff for as long as it takes, or until it has
    been unavailable for ``max_unavailable`` seconds (then the supervisor fails). A
    child that ran for ``healthy_after`` seconds starts that backoff afresh.

    Children run as their own asyncio tasks rather than in a task group: a child
    that ignores cancellation past its ``shutdown_timeout`` can then be reported
    and abandoned, and shutdown still completes (a task group would wait forever).

    ``run()`` returns normally when no child is left running (all ended and none
    is to be restarted) or after :meth:`request_stop`; it raises
    :class:`SupervisorFailed` when restart intensity is exceeded and re-raises
    :class:`Fatal` from any child. Either way every child is stopped first, in
    reverse start order.

        >>> import asyncio
        >>> from supervision import FunctionChild, Supervisor
        >>> async def hello() -> None:
        ...     print("hello")
        >>> sup = Supervisor("top", [ChildSpec(FunctionChild("greeter", hello), Restart.TRANSIENT)])
        >>> asyncio.run(sup.run())  # doctest: +ELLIPSIS
        hello
        ...child_exited...
        >>> sup.state
        'stopped'
    """

    def __init__(
        self,
        name: str,
        children: Sequence[ChildSpec],
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        intensity: Intensity | None = None,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        max_unavailable: float | None = None,
        healthy_after: float = 30.0,
    ) -> None:
        names = [c.name for c in children]
        if len(set(names)) != len(names):
            raise ValueError(f"supervisor {name!r}: child names must be unique, got {names}")
        self.name = name
        self.specs = list(children)
        self.strategy = strategy
        self.intensity = intensity or Intensity()
        self.backoff = backoff or Backoff()
        self.clock: Clock = clock or MonotonicClock()
        self.rng = rng or random.Random()
        self.max_unavailable = max_unavailable
        self.healthy_after = healthy_after
        self.state = "new"
        self.last_error: str | None = None
        self._children = [Running(spec) for spec in self.specs]
        self._exits: asyncio.Queue[Exited | object] | None = None
        self._stopping = asyncio.Event()
        self.log = structlog.get_logger().bind(supervisor=name)

    # -- public ----------------------------------------------------------------
    async def run(self, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every child in order and supervise until stopped or failed.

        Reports ``task_status.started()`` once every child is up.
        """
        self._exits = asyncio.Queue()
        self._stopping = asyncio.Event()
        tracker = RestartIntensity(self.intensity)
        self.state = "running"
        reported = False
        try:
            while True:
                if await self._start_pending() and not reported:
                    task_status.started()
                    reported = True
                if not any(c.task is not None for c in self._children):
                    break
                item = await self._exits.get()
                if item is _STOP:
                    break
                assert isinstance(item, Exited)
                if item.generation != item.running.generation or item.running.stopping:
                    continue  # a stale report from an incarnation already replaced
                await self._on_exit(item, tracker)
            if self.state == "running":
                self.state = "stopped"
        except Fatal as exc:
            self.state, self.last_error = "fatal", describe(exc)
            raise
        except SupervisorFailed as exc:
            self.state, self.last_error = "failed", str(exc)
            raise
        except BaseException:
            self.state = "stopped"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop_all()

    def request_stop(self) -> None:
        """Stop every child (reverse order) and return from ``run()`` normally."""
        self._stopping.set()
        if self._exits is not None:
            self._exits.put_nowait(_STOP)

    def snapshot(self) -> NodeSnapshot:
        """This supervisor and everything under it, as the operator sees it."""
        kids = []
        for c in self._children:
            snap = c.spec.child.snapshot()
            state = snap.state if c.state == "running" else c.state
            kids.append(
                dataclasses.replace(
                    snap,
                    state=state,
                    restarts=c.restarts,
                    last_error=c.last_error or snap.last_error,
                    restart_reasons=tuple(sorted(c.restart_reasons.items())),
                )
            )
        return NodeSnapshot(
            name=self.name,
            kind="supervisor",
            state=self.state,
            last_error=self.last_error,
            children=tuple(kids),
        )

    # -- internals -------------------------------------------------------------
    async def _start_pending(self) -> bool:
        """Start, in order, every child that should run and does not; True once all are up.

        Each waits for the one before it to report that it is up. A child that ends
        before that stops the sequence: its exit is queued and handled first.
        """
        for child in self._children:
            if child.task is not None or child.done:
                continue
            if self._stopping.is_set() or not await self._start(child):
                return False
        return True

    async def _start(self, child: Running) -> bool:
        child.generation += 1
        child.stopping = False
        child.state = "starting"
        child.started_at = self.clock.now()
        status = Started()
        task = asyncio.create_task(
            self._watch(child, child.generation, status), name=f"{self.name}/{child.spec.name}"
        )
        child.task = task
        await self._until_stop(status.event.wait(), task)
        if status.event.is_set() and child.state == "starting":
            child.state = "running"
        return status.event.is_set()

    async def _watch(self, child: Running, generation: int, status: Started) -> None:
        error: BaseException | None = None
        try:
            await child.spec.child.run(status)
        except asyncio.CancelledError as exc:
            if child.stopping:
                raise
            error = RuntimeError("cancelled from outside its supervisor")
            error.__cause__ = exc  # the restart's log shows where: the stack of the cancelled await
        except BaseException as exc:  # noqa: BLE001 - a supervisor must see every failure
            error = exc
        if not child.stopping and self._exits is not None:
            self._exits.put_nowait(Exited(child, generation, error))

    async def _on_exit(self, item: Exited, tracker: RestartIntensity) -> None:
        child, error = item.running, item.error
        child.task = None
        name = child.spec.name
        reason = describe(error)
        if error is not None:
            child.last_error = reason
        if isinstance(error, Fatal):
            child.state = "fatal"
            self.log.error("child_fatal", actor=name, reason=error.reason, exc_info=error)
            raise error
        restart = child.spec.restart
        if restart is Restart.TEMPORARY or (restart is Restart.TRANSIENT and error is None):
            child.state = "stopped" if error is None else "failed"
            child.done = True
            self.log.info(
                "child_exited", actor=name, reason=reason or "normal", restarted=False, exc_info=error
            )
            return
        if isinstance(error, Unavailable):
            delay = self._outage(child, error)
        else:
            delay = self._crash(child, error, tracker)
        group = self._restart_group(child)
        for other in reversed(group):
            if other is not child:
                await self._stop_child(other)
        for member in group:
            member.state = "restarting"
        child.state = "unavailable" if isinstance(error, Unavailable) else "restarting"
        # A stop during the backoff ends it: it waited the backoff out, up to its maximum.
        await self._until_stop(self.clock.sleep(delay))
        if self._stopping.is_set():
            return  # run() sees the stop next, and stops what is left
        for member in group:
            if member is not child and member.spec.restart is Restart.TEMPORARY:
                member.state = "stopped"
                member.done = True
                continue
            member.restarts += 1
            kind = reason_kind(error) if member is child else "group"
            member.restart_reasons[kind] = member.restart_reasons.get(kind, 0) + 1
            self.log.warning(
                "child_restarted",
                actor=member.spec.name,
                reason=reason or "normal exit",
                failed=name,
                restarts=member.restarts,
                delay_s=round(delay, 4),
                exc_info=error if member is child and not isinstance(error, Unavailable) else None,
            )
        # run() starts the group again, in order, each after the one before it is up.

    async def _until_stop(self, wait: Awaitable[Any], *also: asyncio.Task[None]) -> None:
        """Until ``wait`` ends, :meth:`request_stop` is called, or one of ``also`` (tasks left
        running) ends."""
        waiting = asyncio.ensure_future(wait)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stop, *also}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            stop.cancel()

    def _crash(self, child: Running, error: BaseException | None, tracker: RestartIntensity) -> float:
        """A crash (or a normal exit of a permanent child): counted; the delay before the restart."""
        name = child.spec.name
        reason = describe(error)
        child.outage_since = None
        if not tracker.record(self.clock.now()):
            child.state = "failed"
            self.log.error(
                "supervisor_escalated",
                actor=name,
                reason=reason or "normal exit",
                max_restarts=self.intensity.max_restarts,
                within_seconds=self.intensity.within_seconds,
                exc_info=error,
            )
            raise SupervisorFailed(self.name, name, error) from error
        return self.backoff.delay(tracker.recent, self.rng)

    def _outage(self, child: Running, error: Unavailable) -> float:
        """What the child needs is down: not counted; the delay before the next attempt."""
        now = self.clock.now()
        if child.outage_since is None or now - child.started_at >= self.healthy_after:
            child.outage_since, child.outage_attempts = now, 0  # a new outage: backoff afresh
        child.outage_attempts += 1
        down_for = now - child.outage_since
        if self.max_unavailable is not None and down_for > self.max_unavailable:
            child.state = "failed"
            self.log.error(
                "supervisor_gave_up_waiting",
                actor=child.spec.name,
                reason=describe(error),
                unavailable_s=round(down_for, 3),
                max_unavailable_s=self.max_unavailable,
            )
            gave_up = (
                f"gave up after {down_for:.0f}s unavailable (max_unavailable_s {self.max_unavailable:g})"
            )
            raise SupervisorFailed(self.name, child.spec.name, error, gave_up) from error
        delay = self.backoff.delay(child.outage_attempts, self.rng)
        self.log.warning(
            "child_unavailable",
            actor=child.spec.name,
            reason=describe(error),
            attempts=child.outage_attempts,
            unavailable_s=round(down_for, 3),
            retry_in_s=round(delay, 3),
        )
        return delay

    def _restart_group(self, failed: Running) -> list[Running]:
        if self.strategy is Strategy.ONE_FOR_ONE:
            return [failed]
        if self.strategy is Strategy.ONE_FOR_ALL:
            return [c for c in self._children if c.task is not None or c is failed]
        idx = self._children.index(failed)
        return [c for c in self._children[idx:] if c.task is not None or c is failed]

    async def _stop_child(self, child: Running) -> None:
        task = child.task
        child.task = None
        if task is None:
            return
        child.stopping = True
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=child.spec.shutdown_timeout)
        if done:
            child.state = "stopped"
            return
        child.state = "abandoned"
        self.log.error(
            "child_shutdown_timeout",
            actor=child.spec.name,
            reason=f"ignored cancellation for {child.spec.shutdown_timeout:g}s; abandoned",
        )

    async def _stop_all(self) -> None:
        for child in reversed(self._children):
            if child.task is not None:
                await self._stop_child(child)
