"""REST for the dead-letter queue: ``/pipelines/{name}/journal/dlq``.

* ``GET …/dlq?sink=&kind=&limit=`` — entries, oldest first (``limit`` 100 by default).
* ``GET …/dlq/count?sink=`` — ``{"count": n}``.
* ``POST …/dlq/ack`` ``{"up_to": seq}`` or ``{"seqs": [...]}`` (and ``"sink"``) — drop entries:
  ``{"acked": n}``.
* ``DELETE …/dlq?sink=`` — purge: ``{"purged": n}``.
* ``POST …/dlq/replay`` ``{"seqs": [...]}`` or ``{"sink": id}`` — deliver them again, in seq
  order with their original idempotency keys; acked only once delivered: ``{"replayed": n}``.

Errors are ``{"code", "message"}``: ``not_found``, ``bad_request``, ``replay_failed``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deltaforge.api.security import SafeJSONResponse
from deltaforge.pipeline.dlq import DeadLetterQueue
from deltaforge.pipeline.replay import ReplayFailed
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.state.deadletters import Select

Handler = Callable[[PipelineRunner, DeadLetterQueue, Request], Awaitable[Any]]


def error(code: str, message: str, status: int) -> SafeJSONResponse:
    return SafeJSONResponse({"code": code, "message": message}, status_code=status)


class BadRequest(ValueError):
    """A query or body that does not say what it must."""


def _only(given: Iterable[str], allowed: tuple[str, ...], where: str) -> None:
    """A filter misspelt is refused: ignored, ``DELETE …/dlq?snk=a`` purged every sink's entries,
    not sink a's, and an ack's ``"snk"`` acked them all up to its seq."""
    if odd := sorted(set(given) - set(allowed)):
        raise BadRequest(
            f"{where}: unknown {', '.join(map(repr, odd))}; expected any of {', '.join(allowed)}"
        )


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise BadRequest(f"{what}: expected a non-negative integer, got {value!r}")
    return int(value)


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("expected a JSON object body") from None
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object body")
    return body


async def _list(r: PipelineRunner, dlq: DeadLetterQueue, request: Request) -> Any:
    q = request.query_params
    _only(q, ("sink", "kind", "limit"), "query")
    limit = _int(q.get("limit", "100"), "limit")
    return await dlq.show(Select(sink=q.get("sink"), kind=q.get("kind"), limit=limit))


async def _count(r: PipelineRunner, dlq: DeadLetterQueue, request: Request) -> Any:
    _only(request.query_params, ("sink",), "query")
    return {"count": await dlq.count(request.query_params.get("sink"))}


def _seqs(body: dict[str, Any]) -> tuple[int, ...] | None:
    seqs = body.get("seqs")
    if seqs is None:
        return None
    if not isinstance(seqs, list):
        raise BadRequest(f"seqs: expected a list of entry seqs, got {seqs!r}")
    return tuple(_int(s, "seqs[]") for s in seqs)


async def _ack(r: PipelineRunner, dlq: DeadLetterQueue, request: Request) -> Any:
    body = await _body(request)
    _only(body, ("up_to", "seqs", "sink"), "body")
    seqs = _seqs(body)
    if seqs is None and "up_to" not in body:
        raise BadRequest('say which entries: {"up_to": seq} or {"seqs": [...]}')
    up_to = _int(body["up_to"], "up_to") if "up_to" in body else None
    return {"acked": await dlq.remove(Select(sink=body.get("sink"), up_to=up_to, seqs=seqs))}


async def _purge(r: PipelineRunner, dlq: DeadLetterQueue, request: Request) -> Any:
    _only(request.query_params, ("sink",), "query")
    return {"purged": await dlq.remove(Select(sink=request.query_params.get("sink")))}


async def _replay(r: PipelineRunner, dlq: DeadLetterQueue, request: Request) -> Any:
    body = await _body(request)
    _only(body, ("seqs", "sink"), "body")
    seqs, sink = _seqs(body), body.get("sink")
    if seqs is None and sink is None:
        raise BadRequest('say which entries: {"seqs": [...]} or {"sink": "<id>"}')
    which = Select(sink=sink, seqs=seqs)
    return {"replayed": await r.replay_dead_letters(which)}


def routes(pipelines: Mapping[str, PipelineRunner]) -> list[Route]:
    def endpoint(handle: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            name = request.path_params["name"]
            runner = pipelines.get(name)
            if runner is None or runner.ctx.dlq is None:
                return error("not_found", f"no pipeline named {name!r}", 404)
            try:
                return SafeJSONResponse(await handle(runner, runner.ctx.dlq, request))
            except BadRequest as exc:
                return error("bad_request", str(exc), 400)
            except (ReplayFailed, ValueError) as exc:
                return error("replay_failed", str(exc), 409)
            except RuntimeError as exc:  # the store is closed: the pipeline has stopped
                return error("stopped", str(exc), 409)

        return run

    base = "/pipelines/{name}/journal/dlq"
    return [
        Route(base, endpoint(_list), methods=["GET"]),
        Route(base, endpoint(_purge), methods=["DELETE"]),
        Route(f"{base}/count", endpoint(_count), methods=["GET"]),
        Route(f"{base}/ack", endpoint(_ack), methods=["POST"]),
        Route(f"{base}/replay", endpoint(_replay), methods=["POST"]),
    ]
