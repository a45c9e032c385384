"""Run by ``launch.py`` (``python -m deltaforge`` and the ``deltaforge`` command) before anything
else is imported: ``serve --config <path>`` starts its pipelines' decoder children at once, from
the YAML alone.

A decoder child takes a while to start (Python, then psycopg or python-mysql-replication), and
``serve`` imports its modules and reads its configs before it can start one
(``cli._prestart_decoders``). A PostgreSQL child started then was still importing when its source
sent it the settings: on the way to the first event after a restart (docs/performance.md).
Nothing is checked here: a config that does not read, or names no source with a decoder, starts
nothing, and ``serve`` reads and checks every config again before anything runs. Children it
starts that no pipeline takes are stopped when ``serve`` ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltaforge.configfiles import config_files


def decoders(argv: Sequence[str]) -> None:
    """Start the decoder children ``argv`` (the command line after ``python -m deltaforge``) will
    want, if it is ``serve`` with ``--config``."""
    path = _config_path(argv)
    if path is None:
        return
    from deltaforge.sources import childproc

    try:
        import yaml

        wanted = Counter(
            module
            for doc in _documents(Path(path), yaml)
            if (module := childproc.DECODERS.get(_source_type(doc))) is not None
        )
    except Exception:  # noqa: BLE001 - serve reads it again and says what is wrong
        return
    for module, count in wanted.items():
        childproc.prestart(module, count)


def _config_path(argv: Sequence[str]) -> str | None:
    if not argv or argv[0] != "serve":
        return None
    args, path = list(argv[1:]), None
    for i, arg in enumerate(args):  # the last one given, as argparse takes it
        if arg == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
    return path


def _documents(path: Path, yaml: Any) -> list[Any]:
    return [doc for f in config_files(path) for doc in yaml.safe_load_all(f.read_text())]


def _source_type(doc: Any) -> str:
    source = doc.get("spec", {}).get("source", {}) if isinstance(doc, dict) else {}
    kind = source.get("type") if isinstance(source, dict) else None
    return kind if isinstance(kind, str) else ""
