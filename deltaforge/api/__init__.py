"""The REST API (Starlette on uvicorn)."""

from deltaforge.api.app import build_app

__all__ = ["build_app"]
