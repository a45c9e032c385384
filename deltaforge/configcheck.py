"""Checker: collects every configuration problem with its path, instead of stopping at the first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Checker:
    """Collects every problem instead of stopping at the first."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, path: str, msg: str) -> None:
        self.errors.append(f"{path}: {msg}")

    def mapping(self, value: Any, path: str, required: bool = True) -> dict[str, Any]:
        if value is None:
            if required:
                self.err(path, "required (a mapping)")
            return {}
        if not isinstance(value, Mapping):
            self.err(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        return dict(value)

    def string(self, m: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
        value = m.get(key, default)
        if value is None:
            self.err(f"{path}.{key}", "required (a string)")
            return ""
        if not isinstance(value, str) or not value:
            self.err(f"{path}.{key}", f"expected a non-empty string, got {value!r}")
            return ""
        return value

    def integer(self, m: Mapping[str, Any], key: str, path: str, default: int, minimum: int = 0) -> int:
        value = m.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(f"{path}.{key}", f"expected an integer >= {minimum}, got {value!r}")
            return default
        if value < minimum:
            self.err(f"{path}.{key}", f"expected an integer >= {minimum}, got {value}")
        return value

    def number(self, m: Mapping[str, Any], key: str, path: str, default: float) -> float:
        value = m.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            self.err(f"{path}.{key}", f"expected a positive number, got {value!r}")
            return default
        return float(value)

    def boolean(self, m: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = m.get(key, default)
        if not isinstance(value, bool):
            self.err(f"{path}.{key}", f"expected true or false, got {value!r}")
            return default
        return value

    def choice(
        self, m: Mapping[str, Any], key: str, path: str, options: tuple[str, ...], default: str
    ) -> str:
        value = m.get(key, default)
        if value not in options:
            self.err(f"{path}.{key}", f"expected one of {', '.join(options)}, got {value!r}")
            return default
        return str(value)

    def unknown(self, m: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for key in m:
            if key not in allowed:
                self.err(f"{path}.{key}", f"unknown field; expected one of {', '.join(sorted(allowed))}")
