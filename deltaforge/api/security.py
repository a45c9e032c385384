"""What keeps the API safe to expose: a bearer token for changes, and no password ever shown.

* Mutating requests (anything but GET/HEAD/OPTIONS) need ``Authorization: Bearer <token>``
  when a token is set (``DELTAFORGE_API_TOKEN`` or ``serve --api-token-file``); ``serve``
  refuses to listen on a non-loopback address without one (``listen.unsafe_bind``).
* :func:`redact` masks credentials — ``scheme://user:password@`` and ``password=...`` — in
  every API response (:class:`SafeJSONResponse`) and every log line (``logsetup.py``), whatever
  a driver put in an error message.

Example::

    >>> redact("connect to mysql://cdc:s3cret@db:3306/shop failed")
    'connect to mysql://cdc:***@db:3306/shop failed'
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from deltaforge.api.listen import TOKEN_ENV
from deltaforge.redact import redact

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


class SafeJSONResponse(JSONResponse):
    """A JSON response with every password masked (see :func:`redact`)."""

    def render(self, content: Any) -> bytes:
        return redact(super().render(content).decode()).encode()


class TokenGuard:
    """ASGI middleware: a mutating request without the bearer token gets 401."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        body = {
            "code": "unauthorized",
            "message": f"this request needs Authorization: Bearer <the {TOKEN_ENV}>",
        }
        await SafeJSONResponse(body, status_code=401)(scope, receive, send)
