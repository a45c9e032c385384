"""The run's report: a table on the terminal (rich) and the same as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chaos.runner import Result

STYLE = {"passed": "green", "failed": "bold red", "pending": "yellow"}


def _figures(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in figures.items())


def show(results: list[Result], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="deltaforge chaos run")
    for column in ("scenario", "status", "s", "figures"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.name, f"[{STYLE[r.status]}]{r.status}[/]", f"{r.seconds:g}",
                      r.detail.splitlines()[-1] if r.status != "passed" and r.detail else _figures(r.figures))  # fmt: skip
    console.print(table)
    for r in results:
        if r.status == "failed":
            console.print(f"[bold red]{r.name}[/] (logs: {r.logs})\n{r.detail}\n{_figures(r.figures)}")


def write_json(results: list[Result], path: Path, seed: int) -> None:
    doc = {"seed": seed, "results": [vars(r) for r in results]}
    path.write_text(json.dumps(doc, indent=2, default=str))
