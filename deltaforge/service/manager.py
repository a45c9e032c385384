"""PipelineManager: the pipelines of one ``serve``, and their lifecycle.

Pipelines come from the config files (read-only here: edit the file) and from REST
(``create``), which are kept in the :class:`PipelineRegistry` and come back after a
restart. Every change of state goes through here:

* ``create`` — validate, refuse a name in use, keep the document, start it.
* ``pause`` / ``resume`` — the reader stops reading (the source stays connected);
  ``resume`` also starts a stopped pipeline again, from its checkpoints.
* ``stop`` — drain: what was read is delivered and checkpointed, then the tree stops.
* ``patch`` — merge into the document, validate, stop, start again from the checkpoints.
* ``delete`` — stop, forget it, and optionally its checkpoints.

Errors are :class:`LifecycleError` with a stable ``code`` (``not_found``, ``exists``,
``invalid``, ``read_only``, ``bad_state``) for the API to return.
"""

from __future__ import annotations

import asyncio
import copy
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from deltaforge import metrics
from deltaforge.config import ConfigError, PipelineConfig, parse_pipeline
from deltaforge.pipeline.runner import BadState, PipelineRunner


class LifecycleError(Exception):
    """A lifecycle request refused, with a stable code and, for ``invalid``, every error."""

    def __init__(self, code: str, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.errors = errors or []


def merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386): mappings merge key by key, ``null`` removes, the rest replaces."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class PipelineManager:
    """Owns the runners ``serve`` runs; ``pipelines`` is the live mapping the API reads."""

    def __init__(
        self,
        registry: Any,
        make_runner: Callable[[PipelineConfig], PipelineRunner],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.registry = registry
        self.make_runner = make_runner
        self.env = env if env is not None else os.environ
        self.pipelines: dict[str, PipelineRunner] = {}
        self.docs: dict[str, dict[str, Any]] = {}  # pipelines created over REST: their documents
        self.unrestored: dict[str, list[str]] = {}
        """Pipelines created over REST whose kept document no longer validates (a ``${VAR}`` not
        set at this start, a stricter check since), each with its errors: failed in ``/health``
        until deleted, patched valid, or fixed and ``serve`` started again. They were left out
        with a log line and ``/health`` ok: a pipeline gone without a word."""
        self.tasks: dict[str, asyncio.Task[None]] = {}
        # One change at a time per name: two creates of one name both saw it free and both
        # started a runner (one left running, unmanaged), a delete during a patch lost its runner.
        # Weak: a name's lock lives while a request holds or awaits it, not for every name any
        # request ever named (unknown ones included).
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._closing = False
        self.log = structlog.get_logger().bind(actor="PipelineManager")

    def _changing(self, name: str) -> asyncio.Lock:
        """The lock that orders changes of pipeline ``name``."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    # -- start-up and shutdown --------------------------------------------------------------
    def add(self, config: PipelineConfig) -> None:
        """A pipeline from a config file (not created over REST)."""
        self.pipelines[config.name] = self.make_runner(config)

    def restore(self) -> None:
        """The pipelines created over REST before, as they were kept."""
        for name, doc in self.registry.load().items():
            if name in self.pipelines:
                self.log.warning("pipeline_shadowed", pipeline=name, reason="a config file defines it too")
                continue
            try:
                config = parse_pipeline(doc, self.env, f"registry:{name}")
            except ConfigError as exc:
                self.log.error("pipeline_not_restored", pipeline=name, errors=exc.errors)
                self.unrestored[name] = exc.errors
                continue
            self.docs[name] = doc
            self.pipelines[name] = self.make_runner(config)

    def start_all(self) -> None:
        for name in self.pipelines:
            self._start(name)

    async def drain_all(self) -> None:
        """Drain every pipeline, each after a change in progress (a patch's restart) is done; no
        change starts a pipeline after this began (it would run past the end of serve)."""
        self._closing = True
        await asyncio.gather(*(self._drain(name) for name in list(self.pipelines)))
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def _drain(self, name: str) -> None:
        async with self._changing(name):
            await self.pipelines[name].drain()

    def _open_for_changes(self) -> None:
        if self._closing:
            raise LifecycleError("bad_state", "serve is shutting down: no pipeline starts now")

    def stop_all_now(self) -> None:
        """Every pipeline stops at once, without draining (see :meth:`PipelineRunner.stop_now`)."""
        for runner in self.pipelines.values():
            runner.stop_now()

    def _start(self, name: str) -> None:
        runner = self.pipelines[name]
        self.tasks[name] = asyncio.create_task(runner.run(), name=f"pipeline:{name}")

    # -- lifecycle ------------------------------------------------------------------------
    def _runner(self, name: str) -> PipelineRunner:
        runner = self.pipelines.get(name)
        if runner is None:
            raise LifecycleError("not_found", f"no pipeline named {name!r}")
        return runner

    def _parse(self, doc: Any, label: str) -> PipelineConfig:
        try:
            return parse_pipeline(doc, self.env, label)
        except ConfigError as exc:
            raise LifecycleError(
                "invalid", f"{label}: the pipeline document is invalid", exc.errors
            ) from None

    async def create(self, doc: Any) -> PipelineRunner:
        config = self._parse(doc, "request")
        async with self._changing(config.name):
            self._open_for_changes()
            if config.name in self.pipelines or config.name in self.unrestored:
                raise LifecycleError("exists", f"a pipeline named {config.name!r} exists already")
            await self.registry.put(config.name, doc)
            self.docs[config.name] = doc
            self.pipelines[config.name] = self.make_runner(config)
            self._start(config.name)
            self.log.info("pipeline_created", pipeline=config.name)
            return self.pipelines[config.name]

    async def pause(self, name: str) -> PipelineRunner:
        async with self._changing(name):
            runner = self._runner(name)
            try:
                await runner.pause()
            except BadState as exc:
                raise LifecycleError("bad_state", str(exc)) from None
            return runner

    async def resume(self, name: str) -> PipelineRunner:
        async with self._changing(name):
            runner = self._runner(name)
            if runner.state == "paused":
                await runner.resume()
                return runner
            if runner.state in ("stopped", "failed"):
                self._open_for_changes()
                return await self._restart(name, runner.config)
            raise LifecycleError("bad_state", f"pipeline {name!r} is {runner.state}, not paused or stopped")

    async def stop(self, name: str) -> PipelineRunner:
        async with self._changing(name):
            runner = self._runner(name)
            if runner.state not in ("running", "paused", "starting"):
                raise LifecycleError("bad_state", f"pipeline {name!r} is {runner.state} already")
            await self._stop(name)
            self.log.info("pipeline_stopped_by_request", pipeline=name)
            return runner

    async def patch(self, name: str, change: Any) -> PipelineRunner:
        async with self._changing(name):
            if name in self.unrestored:
                return await self._patch_unrestored(name, change)
            self._runner(name)
            self._open_for_changes()
            doc = self.docs.get(name)
            if doc is None:
                raise LifecycleError(
                    "read_only", f"pipeline {name!r} comes from a config file: edit the file"
                )
            config = await self._keep_patched(name, doc, change)
            return await self._restart(name, config)

    async def delete(self, name: str, keep_checkpoints: bool = True) -> None:
        async with self._changing(name):
            if name in self.unrestored:
                await self._forget_unrestored(name, keep_checkpoints)
                return
            runner = self._runner(name)
            if name not in self.docs:
                raise LifecycleError(
                    "read_only", f"pipeline {name!r} comes from a config file: remove it there"
                )
            await self._stop(name)
            if not keep_checkpoints:
                await runner.forget_checkpoints()
                with structlog.contextvars.bound_contextvars(pipeline=name):
                    await runner.source.forget()  # a PostgreSQL slot would keep WAL for ever
            await self.registry.delete(name)
            del self.docs[name], self.pipelines[name]
            self.tasks.pop(name, None)
            metrics.forget(name)
            self.log.info("pipeline_deleted", pipeline=name, checkpoints_kept=keep_checkpoints)

    async def _keep_patched(self, name: str, doc: dict[str, Any], change: Any) -> PipelineConfig:
        """``doc`` with ``change`` merged in, validated and kept (the registry, ``docs``)."""
        if not isinstance(change, dict):
            raise LifecycleError("invalid", "expected a JSON merge patch (an object)")
        merged = merge(doc, change)
        config = self._parse(merged, "patched document")
        if config.name != name:
            raise LifecycleError("invalid", f"metadata.name cannot change ({name!r} to {config.name!r})")
        await self.registry.put(name, merged)
        self.docs[name] = merged
        self.log.info("pipeline_patched", pipeline=name)
        return config

    async def _patch_unrestored(self, name: str, change: Any) -> PipelineRunner:
        """The REST way to fix a pipeline that was not restored: patched valid, it starts."""
        self._open_for_changes()
        config = await self._keep_patched(name, self.registry.docs[name], change)
        del self.unrestored[name]
        self.pipelines[name] = self.make_runner(config)
        self._start(name)
        return self.pipelines[name]

    async def _forget_unrestored(self, name: str, keep_checkpoints: bool) -> None:
        if not keep_checkpoints:  # where they are is in the document that does not validate
            raise LifecycleError(
                "invalid", f"pipeline {name!r} was not restored (its document is invalid): its checkpoints "
                "cannot be found to delete; delete it keeping them",
            )  # fmt: skip
        await self.registry.delete(name)
        del self.unrestored[name]
        self.log.info("pipeline_deleted", pipeline=name, checkpoints_kept=True)

    def unrestored_status(self, name: str) -> dict[str, Any]:
        """What the API says of a pipeline that was not restored."""
        return {"name": name, "state": "failed", "failure": self.not_restored(name)}

    def not_restored(self, name: str) -> str:
        return f"created over REST, not restored at this start: {'; '.join(self.unrestored[name])}"

    async def _stop(self, name: str) -> None:
        runner = self.pipelines[name]
        if runner.state in ("running", "paused", "starting", "draining"):
            await runner.drain()
        task = self.tasks.get(name)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _restart(self, name: str, config: PipelineConfig) -> PipelineRunner:
        await self._stop(name)
        self.pipelines[name] = self.make_runner(config)
        self._start(name)
        return self.pipelines[name]
