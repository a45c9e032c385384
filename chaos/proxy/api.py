"""Toxiproxy's HTTP API (v2.9 ``api.go``), on Starlette, over :class:`ProxyServer`'s proxies.

Status codes and bodies are Toxiproxy's: 201 on proxy create and populate, 200 on
toxic create and updates, 204 on deletes and reset, errors as
``{"error": message, "status": code}`` with 400, 404, 409 (and 403 for a browser's
``Mozilla/`` user agent).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaos.proxy.proxy import Proxy, ProxyError

VERSION = "2.9.0-deltaforge"
Handler = Callable[[Request], Awaitable[Response]]


class ProxyServer:
    """The proxies, by name."""

    def __init__(self) -> None:
        self.proxies: dict[str, Proxy] = {}

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ProxyError("proxy not found", 404)
        return proxy

    async def create(self, body: Any) -> Proxy:
        if not isinstance(body, dict):
            raise ProxyError("bad request body", 400)
        if not body.get("name"):
            raise ProxyError("missing required field: name", 400)
        if not body.get("upstream"):
            raise ProxyError("missing required field: upstream", 400)
        name = str(body["name"])
        if name in self.proxies:
            raise ProxyError("proxy already exists", 409)
        proxy = Proxy(name, str(body.get("listen") or ""), str(body["upstream"]))
        if body.get("enabled", True):
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def remove(self, name: str) -> None:
        await self.get(name).stop()
        del self.proxies[name]

    async def close(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()


def error(message: str, status: int) -> Response:
    # Toxiproxy writes the JSON through Go's http.Error: text/plain, with a newline.
    body = json.dumps({"error": message, "status": status}) + "\n"
    return Response(body, status_code=status, media_type="text/plain; charset=utf-8")


def build_api(server: ProxyServer) -> Starlette:
    async def body_of(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise ProxyError("bad request body: invalid JSON", 400) from None

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            if request.headers.get("user-agent", "").startswith("Mozilla/"):
                return Response("User agent not allowed\n", status_code=403, media_type="text/plain")
            try:
                return await handler(request)
            except ProxyError as exc:
                return error(str(exc), exc.status)

        return run

    async def version(request: Request) -> Response:
        return Response(json.dumps({"version": VERSION}) + "\n", media_type="application/json;charset=utf-8")

    async def reset(request: Request) -> Response:
        for proxy in server.proxies.values():
            await proxy.start()
            proxy.reset_toxics()
        return Response(status_code=204)

    async def proxy_index(request: Request) -> Response:
        return JSONResponse({name: p.to_json() for name, p in server.proxies.items()})

    async def proxy_create(request: Request) -> Response:
        proxy = await server.create(await body_of(request))
        return JSONResponse(proxy.to_json(), status_code=201)

    async def populate(request: Request) -> Response:
        body = await body_of(request)
        if not isinstance(body, list):
            raise ProxyError("bad request body", 400)
        made: list[Proxy] = []
        for entry in body:
            if not isinstance(entry, dict):
                raise ProxyError("bad request body", 400)
            known = server.proxies.get(str(entry.get("name")))
            if known is not None and (
                known.upstream != entry.get("upstream") or entry.get("listen") not in (None, known.listen)
            ):
                await server.remove(known.name)
                known = None
            made.append(known if known is not None else await server.create(entry))
        return JSONResponse({"proxies": [p.to_json() for p in made]}, status_code=201)

    async def proxy_show(request: Request) -> Response:
        return JSONResponse(server.get(request.path_params["proxy"]).to_json())

    async def proxy_update(request: Request) -> Response:
        proxy = server.get(request.path_params["proxy"])
        body = await body_of(request)
        if not isinstance(body, dict):
            raise ProxyError("bad request body", 400)
        await proxy.update(body)
        return JSONResponse(proxy.to_json())

    async def proxy_delete(request: Request) -> Response:
        await server.remove(request.path_params["proxy"])
        return Response(status_code=204)

    async def toxic_index(request: Request) -> Response:
        return JSONResponse([t.to_json() for t in server.get(request.path_params["proxy"]).toxics])

    async def toxic_create(request: Request) -> Response:
        proxy = server.get(request.path_params["proxy"])
        return JSONResponse(proxy.add_toxic(await body_of(request)).to_json())

    async def toxic_show(request: Request) -> Response:
        proxy = server.get(request.path_params["proxy"])
        return JSONResponse(proxy.toxic(request.path_params["toxic"]).to_json())

    async def toxic_update(request: Request) -> Response:
        proxy = server.get(request.path_params["proxy"])
        toxic = proxy.update_toxic(request.path_params["toxic"], await body_of(request))
        return JSONResponse(toxic.to_json())

    async def toxic_delete(request: Request) -> Response:
        server.get(request.path_params["proxy"]).remove_toxic(request.path_params["toxic"])
        return Response(status_code=204)

    routes = [
        Route("/version", guarded(version), methods=["GET"]),
        Route("/reset", guarded(reset), methods=["POST"]),
        Route("/populate", guarded(populate), methods=["POST"]),
        Route("/proxies", guarded(proxy_index), methods=["GET"]),
        Route("/proxies", guarded(proxy_create), methods=["POST"]),
        Route("/proxies/{proxy}", guarded(proxy_show), methods=["GET"]),
        Route("/proxies/{proxy}", guarded(proxy_update), methods=["POST", "PATCH"]),
        Route("/proxies/{proxy}", guarded(proxy_delete), methods=["DELETE"]),
        Route("/proxies/{proxy}/toxics", guarded(toxic_index), methods=["GET"]),
        Route("/proxies/{proxy}/toxics", guarded(toxic_create), methods=["POST"]),
        Route("/proxies/{proxy}/toxics/{toxic}", guarded(toxic_show), methods=["GET"]),
        Route("/proxies/{proxy}/toxics/{toxic}", guarded(toxic_update), methods=["POST", "PATCH"]),
        Route("/proxies/{proxy}/toxics/{toxic}", guarded(toxic_delete), methods=["DELETE"]),
    ]
    return Starlette(routes=routes)


async def serve(host: str, port: int) -> None:
    """Run the API and its proxies until cancelled."""
    import uvicorn

    proxies = ProxyServer()
    config = uvicorn.Config(build_api(proxies), host=host, port=port, log_level="warning", lifespan="off")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await proxies.close()
