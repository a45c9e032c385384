"""Pipelines created over REST, kept so that they come back when ``serve`` starts again.

One JSON file (``<data-dir>/pipelines.json``), rewritten atomically on every change
(temp file, fsync, rename, fsync of the folder): each pipeline's document as it was
given, ``${VAR}`` references unexpanded, so no secret from the environment is stored.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from actors import in_thread
from deltaforge.state.checkpoints import _atomic_write


class PipelineRegistry:
    """name -> pipeline document, on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.docs: dict[str, dict[str, Any]] = {}
        self._saving = asyncio.Lock()

    def load(self) -> dict[str, dict[str, Any]]:
        if self.path.exists():
            self.docs = dict(orjson.loads(self.path.read_bytes()))
        return dict(self.docs)

    async def put(self, name: str, doc: dict[str, Any]) -> None:
        self.docs[name] = doc
        await self._save()

    async def delete(self, name: str) -> None:
        if self.docs.pop(name, None) is not None:
            await self._save()

    async def _save(self) -> None:
        # One rewrite at a time, of the documents as they are when its turn comes: side by side,
        # two rewrites could land in the other order and drop a pipeline already created.
        async with self._saving:
            await in_thread(_atomic_write, self.path, orjson.dumps(self.docs))
