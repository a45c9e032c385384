"""REST for snapshots: ``/pipelines/{name}/snapshots``.

* ``POST …/snapshots`` ``{"tables": ["db.table", ...]}`` — snapshot these tables while
  streaming goes on (they join a snapshot already running): 202 and the snapshot status.
* ``GET …/snapshots`` — the running snapshot (rows, estimate, rows/s, ETA per table) and the
  last ones finished; the same as ``snapshot`` in ``GET /pipelines/{name}``.

Errors are ``{"code", "message"}``: ``not_found``, ``bad_request`` (no tables, an unknown table,
one without a primary key), ``bad_state`` (the pipeline is not running), ``unavailable`` (503:
its source is down; nothing was started, ask again once it is back).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deltaforge.api.security import SafeJSONResponse
from deltaforge.pipeline.runner import BadState, NotNow, PipelineRunner
from deltaforge.snapshot.chunks import SnapshotRefused


def error(code: str, message: str, status: int) -> SafeJSONResponse:
    return SafeJSONResponse({"code": code, "message": message}, status_code=status)


def routes(pipelines: Mapping[str, PipelineRunner]) -> list[Route]:
    async def snapshots(request: Request) -> Response:
        name = request.path_params["name"]
        runner = pipelines.get(name)
        if runner is None:
            return error("not_found", f"no pipeline named {name!r}", 404)
        if request.method == "GET":
            return SafeJSONResponse(runner.ctx.snapshot.to_dict())
        try:
            body = await request.json()
        except ValueError:
            body = None
        tables = body.get("tables") if isinstance(body, dict) else None
        if not isinstance(tables, list) or not tables or not all(isinstance(t, str) and t for t in tables):
            return error("bad_request", f'expected {{"tables": ["db.table", ...]}}, got {body!r}', 400)
        try:
            return SafeJSONResponse(await runner.take_snapshot(tables, by="api"), status_code=202)
        except SnapshotRefused as exc:
            return error("bad_request", exc.reason, 400)
        except BadState as exc:
            return error("bad_state", str(exc), 409)
        except NotNow as exc:
            return error("unavailable", str(exc), 503)

    return [Route("/pipelines/{name}/snapshots", snapshots, methods=["GET", "POST"])]
