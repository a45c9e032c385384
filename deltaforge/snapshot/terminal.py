"""The progress bar ``serve`` draws on a terminal while snapshots run: one line per table with
rows done of the server's estimate, rows/s and ETA. Log lines print above it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

if TYPE_CHECKING:
    from deltaforge.pipeline.runner import PipelineRunner


class SnapshotProgress:
    """Bars for the tables of every running snapshot of ``runners`` (read from their status)."""

    def __init__(self, runners: Mapping[str, PipelineRunner], console: Console | None = None) -> None:
        self.runners = runners
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>9} rows/s"),
            TextColumn("ETA {task.fields[eta]}"),
            console=console or Console(stderr=True),
            auto_refresh=False,
        )
        self.tasks: dict[tuple[str, str], TaskID] = {}

    @property
    def active(self) -> bool:
        return any(r.ctx.snapshot.running for r in self.runners.values())

    def update(self) -> None:
        """Bring every bar up to date (a bar per table a snapshot of this process has taken up)."""
        for name, runner in self.runners.items():
            current = runner.ctx.snapshot.to_dict()["current"]
            for table, t in (current or {}).get("tables", {}).items():
                key = (name, table)
                fields: dict[str, Any] = {
                    "rate": f"{t['rows_per_s']:,.0f}",
                    "eta": _eta(t["eta_s"], t["done"]),
                }
                # A table read past its estimate has no known end: a pulsing bar, rows of "?".
                total = t["estimate"] if t["done"] or t["rows"] < t["estimate"] else None
                if key not in self.tasks:
                    self.tasks[key] = self.progress.add_task(f"{name} {table}", total=total, **fields)
                self.progress.update(self.tasks[key], completed=t["rows"], total=total, **fields)

    async def run(self, interval: float = 0.5) -> None:
        """Until cancelled: draw while a snapshot runs, get out of the way otherwise."""
        while True:
            while not self.active:
                await asyncio.sleep(interval)
            with Live(
                self.progress, console=self.progress.console, redirect_stderr=True, auto_refresh=False
            ) as live:
                while self.active:
                    self.update()
                    live.refresh()
                    await asyncio.sleep(interval)
                self.update()
                live.refresh()


def _eta(seconds: float | None, done: bool) -> str:
    if done:
        return "done"
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"
