"""The REST API (Starlette on uvicorn)."""

from deltaforge.api.app import build_app, build_metrics_app

__all__ = ["build_app", "build_metrics_app"]
