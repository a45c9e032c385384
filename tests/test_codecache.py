"""The compiled dataclass methods kept between runs (deltaforge/codecache.py): what is built
from them is what dataclasses builds, and a start reuses them."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltaforge.codecache import CodeCache


def _build() -> type:
    # make_dataclass: field types are objects here, not this module's __future__ strings
    return dataclasses.make_dataclass(
        "Point", [("x", int), ("y", float, dataclasses.field(default=0.5))], frozen=True, slots=True
    )


def test_classes_built_from_cached_code_are_the_classes_dataclasses_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _build()
    first = CodeCache(tmp_path / "codes.marshal")
    monkeypatch.setattr(dataclasses, "exec", first.exec, raising=False)
    compiled = _build()
    compiles = first.added + first.hits
    assert first.added > 0
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    first.save()
    again = CodeCache(tmp_path / "codes.marshal")
    again.load()
    monkeypatch.setattr(dataclasses, "exec", again.exec, raising=False)
    cached = _build()
    assert again.added == 0 and again.hits == compiles  # every method from the file
    for cls in (compiled, cached):
        p = cls(1)
        assert repr(p) == repr(plain(1)) == "Point(x=1, y=0.5)"
        assert p == cls(1, 0.5) and hash(p) == hash(cls(1, 0.5)) and p != cls(2)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.x = 3  # type: ignore[attr-defined]
        # compiled as dataclasses compiles it: no __future__ flag inherited (annotations stay objects)
        assert (
            cls.__init__.__annotations__
            == plain.__init__.__annotations__
            == {"x": int, "y": float, "return": None}
        )
        for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__"):
            assert getattr(cls, name).__code__.co_code == getattr(plain, name).__code__.co_code


def test_a_damaged_or_foreign_file_means_compiling_as_before(tmp_path: Path) -> None:
    path = tmp_path / "codes.marshal"
    for content in (b"", b"not marshal at all", b"\x00\x00\x00\x00" + b"x" * 40):
        path.write_bytes(content)
        cache = CodeCache(path)
        cache.load()
        assert cache.codes == {}
        ns: dict[str, object] = {}
        cache.exec("def f():\n return 42", None, ns)
        assert ns["f"]() == 42 and cache.added == 1  # type: ignore[operator]


def test_a_start_writes_the_file_once_and_the_next_start_compiles_nothing(tmp_path: Path) -> None:
    """What serve's command line imports first installs the cache; nothing is written when
    bytecode writing is off."""
    script = (
        "import deltaforge.leanstart, deltaforge.pipeline.runner\n"
        "from deltaforge import codecache\n"
        "print(codecache._installed.added, codecache._installed.hits)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_CACHE_HOME"] = str(tmp_path)

    def start(**extra: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", script], env={**env, **extra}, check=True,
                             capture_output=True, text=True).stdout.split()  # fmt: skip
        return int(out[0]), int(out[1])

    added, _ = start(PYTHONDONTWRITEBYTECODE="1")
    assert added > 100 and not (tmp_path / "deltaforge").exists()
    assert start()[0] == added
    files = list((tmp_path / "deltaforge").iterdir())
    assert [f.name for f in files] == [f"dataclass-code.{sys.implementation.cache_tag}.marshal"]
    again, hits = start()
    assert again == 0 and hits >= added
