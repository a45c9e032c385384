"""The REST API (Starlette on uvicorn).

The web stack is imported when the app is built, not with this package: ``serve`` binds its
sockets (``listen``) and starts its pipelines first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltaforge.api.app import build_app, build_metrics_app

__all__ = ["build_app", "build_metrics_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from deltaforge.api import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
