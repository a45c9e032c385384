"""REST for the pipelines' lifecycle (``service/manager.py`` does the work).

* ``POST /pipelines`` — create from a document, JSON or YAML (``Content-Type:
  application/yaml``): 201, or 409 ``exists``, 400 ``invalid`` with every error.
* ``PATCH /pipelines/{name}`` — a JSON merge patch of its document; restarts it from its
  checkpoints. Config-file pipelines are ``read_only``.
* ``POST /pipelines/{name}/pause|resume|stop``.
* ``DELETE /pipelines/{name}[?checkpoints=delete]`` — checkpoints are kept unless asked.
* ``GET /pipelines/{name}/spec`` — the document of a pipeline created over REST.

Answers are the pipeline's status, errors ``{"code", "message"}`` (and ``errors``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deltaforge.api.security import SafeJSONResponse
from deltaforge.service.manager import LifecycleError, PipelineManager

STATUS = {"not_found": 404, "exists": 409, "invalid": 400, "read_only": 409, "bad_state": 409}


async def _document(request: Request) -> Any:
    body = await request.body()
    try:
        if "yaml" in request.headers.get("content-type", ""):
            return yaml.safe_load(body)
        import json

        return json.loads(body)
    except (ValueError, yaml.YAMLError) as exc:
        raise LifecycleError("invalid", f"cannot read the request body: {exc}") from None


def routes(manager: PipelineManager) -> list[Route]:
    def endpoint(
        handle: Callable[[Request], Awaitable[Any]], status: int = 200
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return SafeJSONResponse(await handle(request), status_code=status)
            except LifecycleError as exc:
                body: dict[str, Any] = {"code": exc.code, "message": str(exc)}
                if exc.errors:
                    body["errors"] = exc.errors
                return SafeJSONResponse(body, status_code=STATUS[exc.code])

        return run

    def name(request: Request) -> str:
        return str(request.path_params["name"])

    async def create(request: Request) -> Any:
        return (await manager.create(await _document(request))).status()

    async def patch(request: Request) -> Any:
        return (await manager.patch(name(request), await _document(request))).status()

    async def pause(request: Request) -> Any:
        return (await manager.pause(name(request))).status()

    async def resume(request: Request) -> Any:
        return (await manager.resume(name(request))).status()

    async def stop(request: Request) -> Any:
        return (await manager.stop(name(request))).status()

    async def delete(request: Request) -> Any:
        keep = request.query_params.get("checkpoints") != "delete"
        await manager.delete(name(request), keep_checkpoints=keep)
        return {"deleted": name(request), "checkpoints_kept": keep}

    async def spec(request: Request) -> Any:
        doc = manager.docs.get(name(request))
        if doc is None:
            raise LifecycleError("not_found", f"no pipeline created over REST named {name(request)!r}")
        return doc

    return [
        Route("/pipelines", endpoint(create, 201), methods=["POST"]),
        Route("/pipelines/{name}", endpoint(patch), methods=["PATCH"]),
        Route("/pipelines/{name}", endpoint(delete), methods=["DELETE"]),
        Route("/pipelines/{name}/pause", endpoint(pause), methods=["POST"]),
        Route("/pipelines/{name}/resume", endpoint(resume), methods=["POST"]),
        Route("/pipelines/{name}/stop", endpoint(stop), methods=["POST"]),
        Route("/pipelines/{name}/spec", endpoint(spec), methods=["GET"]),
    ]
