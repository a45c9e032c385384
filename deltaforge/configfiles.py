"""Which files ``--config`` names: a YAML file, or every ``*.yaml``/``*.yml`` in a folder.

Light on purpose (no pydantic): ``earlystart`` reads the same files before ``serve`` imports
its config models, and must find the same pipelines ``config.load`` then checks.
"""

from __future__ import annotations

from pathlib import Path


def config_files(path: Path) -> list[Path]:
    """``path`` itself, or a folder's YAML files in name order."""
    return sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
