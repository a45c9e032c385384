"""REST endpoints: health, pipelines, their actor trees, checkpoints, failover identity, schemas.

Errors are ``{"code", "message"}``, as everywhere in the API: ``not_found`` (no such pipeline),
``not_restored`` (created over REST, its kept document invalid at this start: see the manager),
``stopped`` (its state store is closed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deltaforge.api import journal, lifecycle, snapshots
from deltaforge.api.security import SafeJSONResponse, TokenGuard
from deltaforge.metrics import render
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.service.manager import PipelineManager


def build_app(
    pipelines: Mapping[str, PipelineRunner], token: str | None = None, manager: PipelineManager | None = None
) -> Starlette:
    """A Starlette app over the running pipelines (the mapping is read live); with ``token``,
    mutating requests need it (see ``security.py``); with ``manager``, the lifecycle endpoints too."""

    unrestored = manager.unrestored if manager is not None else {}

    def _get(request: Request) -> PipelineRunner | Response:
        name = request.path_params["name"]
        runner = pipelines.get(name)
        if runner is None and name in unrestored and manager is not None:
            body = {"code": "not_restored", "message": f"pipeline {name!r}: {manager.not_restored(name)}"}
            return SafeJSONResponse(body, status_code=404)
        if runner is None:
            return SafeJSONResponse(
                {"code": "not_found", "message": f"no pipeline named {name!r}"}, status_code=404
            )
        return runner

    def states(request: Request) -> dict[str, str]:
        return {n: "degraded" if r.degraded else r.state for n, r in pipelines.items()}

    async def health(request: Request) -> Response:
        """Alive? 503 only for what retrying cannot fix; 200 ``degraded`` while waiting for a server."""
        failed = {n: r.failure for n, r in pipelines.items() if r.state == "failed"}
        if manager is not None:
            failed |= {n: manager.not_restored(n) for n in unrestored}
        if failed:
            reasons = [f"{n}: {why}" for n, why in failed.items()]
            return SafeJSONResponse({"status": "failed", "reasons": reasons}, status_code=503)
        degraded = {n: r.ctx.availability.view() for n, r in pipelines.items() if r.degraded}
        if degraded:
            body = {"status": "degraded", "pipelines": states(request), "unavailable": degraded}
            return SafeJSONResponse(body)
        return SafeJSONResponse({"status": "ok", "pipelines": states(request)})

    async def ready(request: Request) -> Response:
        """Doing its job? 200 only while every pipeline runs with its source and sinks reachable."""
        current = states(request) | {n: "failed" for n in unrestored}
        ok = all(state == "running" for state in current.values())
        return SafeJSONResponse({"ready": ok, "pipelines": current}, status_code=200 if ok else 503)

    async def list_pipelines(request: Request) -> Response:
        shown = [r.status() for r in pipelines.values()]
        if manager is not None:
            shown += [manager.unrestored_status(n) for n in unrestored]
        return SafeJSONResponse(shown)

    async def pipeline(request: Request) -> Response:
        if (name := request.path_params["name"]) in unrestored and manager is not None:
            return SafeJSONResponse(manager.unrestored_status(name))
        r = _get(request)
        return r if isinstance(r, Response) else SafeJSONResponse(r.status())

    async def actors(request: Request) -> Response:
        r = _get(request)
        return r if isinstance(r, Response) else SafeJSONResponse(r.snapshot().to_dict())

    def stored(
        read: Callable[[PipelineRunner], Awaitable[Any]] | Callable[[PipelineRunner, str], Awaitable[Any]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """An endpoint answering from the pipeline's state store (with the path's ``table``, if any)."""

        async def endpoint(request: Request) -> Response:
            r = _get(request)
            if isinstance(r, Response):
                return r
            args = [request.path_params["table"]] if "table" in request.path_params else []
            try:
                return SafeJSONResponse(await read(r, *args))
            except RuntimeError as exc:  # store closed: the pipeline has stopped
                return SafeJSONResponse({"code": "stopped", "message": str(exc)}, status_code=409)

        return endpoint

    return Starlette(
        middleware=[Middleware(TokenGuard, token=token)],
        routes=[
            Route("/metrics", _metrics(pipelines)),
            Route("/health", health),
            Route("/ready", ready),
            Route("/pipelines", list_pipelines),
            Route("/pipelines/{name}", pipeline),
            Route("/pipelines/{name}/actors", actors),
            Route("/pipelines/{name}/checkpoints", stored(PipelineRunner.checkpoints)),
            Route("/pipelines/{name}/identity", stored(PipelineRunner.identity)),
            Route("/pipelines/{name}/reconcile", stored(PipelineRunner.reconcile_records)),
            Route("/pipelines/{name}/schemas", stored(PipelineRunner.schemas)),
            Route("/pipelines/{name}/schemas/{table}/versions", stored(PipelineRunner.schema_versions)),
            *journal.routes(pipelines),
            *snapshots.routes(pipelines),
            *(lifecycle.routes(manager) if manager is not None else []),
        ],
    )


def build_metrics_app(pipelines: Mapping[str, PipelineRunner]) -> Starlette:
    """``/metrics`` alone, for ``serve --metrics-addr`` (a port scrapers may reach, the API not)."""
    return Starlette(routes=[Route("/metrics", _metrics(pipelines))])


def _metrics(pipelines: Mapping[str, PipelineRunner]) -> Callable[[Request], Awaitable[Response]]:
    async def metrics(request: Request) -> Response:
        """Prometheus text exposition (see ``deltaforge/metrics.py``)."""
        return Response(render(pipelines), media_type=CONTENT_TYPE_LATEST)

    return metrics
