"""``deltaforge top``: a live terminal view of a running ``serve``, read from its API.

For each pipeline: its state, events/s (read and committed, from two successive
samples), source lag (the ``deltaforge_source_lag_seconds`` gauge), each sink's
checkpoint age and the DLQ count; then its supervisor tree, each actor with its
state, mailbox fill and restarts. It only reads (GET), so it needs no token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

STATE_STYLE = {"running": "green", "degraded": "yellow", "restarting": "yellow", "unavailable": "yellow",
               "failed": "bold red", "fatal": "bold red", "stopped": "dim", "starting": "cyan"}  # fmt: skip


@dataclass
class Sample:
    """What one poll of the API returned, and when."""

    at: float
    pipelines: list[dict[str, Any]]
    trees: dict[str, dict[str, Any]] = field(default_factory=dict)
    dlq: dict[str, int] = field(default_factory=dict)
    lag: dict[str, float] = field(default_factory=dict)


def poll(client: httpx.Client) -> Sample:
    pipelines = client.get("/pipelines").json()
    sample = Sample(time.monotonic(), pipelines)
    for p in pipelines:
        name = p["name"]
        tree = client.get(f"/pipelines/{name}/actors")
        if tree.status_code == 200:  # not for one that was not restored: it has no tree
            sample.trees[name] = tree.json()
        count = client.get(f"/pipelines/{name}/journal/dlq/count")
        sample.dlq[name] = count.json().get("count", 0) if count.status_code == 200 else 0
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name == "deltaforge_source_lag_seconds":
            for s in family.samples:
                name = s.labels["pipeline"]
                sample.lag[name] = max(sample.lag.get(name, 0.0), s.value)
    return sample


def _rate(now: Sample, before: Sample | None, name: str, counter: str) -> float | None:
    if before is None or now.at <= before.at:
        return None
    old = next((p for p in before.pipelines if p["name"] == name), None)
    new = next(p for p in now.pipelines if p["name"] == name)
    if old is None or "counters" not in old or "counters" not in new:
        return None
    moved = float(new["counters"][counter]) - float(old["counters"][counter])
    return max(0.0, moved / (now.at - before.at))


def _fmt_rate(value: float | None) -> str:
    return "…" if value is None else f"{value:,.0f}"


def _tree(node: dict[str, Any], parent: Tree | None = None) -> Tree:
    state = node.get("state", "?")
    label = Text(node["name"], style="bold" if node.get("children") else "")
    label.append(f"  {state}", style=STATE_STYLE.get(state, ""))
    box = node.get("mailbox")
    if box:
        depth, cap = box["depth"] or 0, box["capacity"] or 1
        filled = round(8 * depth / cap)
        label.append(
            f"  [{'█' * filled}{'·' * (8 - filled)}] {depth}/{cap}", style="red" if depth >= cap else ""
        )
    if node.get("restarts"):
        label.append(f"  ↻{node['restarts']}", style="yellow")
    branch = Tree(label) if parent is None else parent.add(label)
    for child in node.get("children", []):
        _tree(child, branch)
    return branch


def render(now: Sample, before: Sample | None) -> RenderableType:
    """One frame: a panel per pipeline."""
    if not now.pipelines:
        return Text("no pipelines")
    panels: list[RenderableType] = []
    wall = time.time()
    for p in now.pipelines:
        name = p["name"]
        state = "degraded" if p.get("degraded") else p["state"]
        head = Table.grid(padding=(0, 2))
        for _ in range(6):
            head.add_column()
        head.add_row("state", "read/s", "committed/s", "lag", "DLQ", "failure")
        lag = now.lag.get(name)
        head.add_row(
            Text(state, style=STATE_STYLE.get(state, "")),
            _fmt_rate(_rate(now, before, name, "events_read")),
            _fmt_rate(_rate(now, before, name, "events_committed")),
            "—" if lag is None else f"{lag:.1f}s",
            str(now.dlq.get(name, 0)),
            p.get("failure") or "",
        )
        sinks = Table("sink", "events", "errors", "checkpoint age", box=None, padding=(0, 2))
        for sid, s in p.get("counters", {}).get("sinks", {}).items():
            at = s.get("checkpoint_at")
            sinks.add_row(
                sid,
                f"{s['events']:,}",
                str(s["errors"]),
                "—" if at is None else f"{max(0.0, wall - at):.1f}s",
            )
        tree = now.trees.get(name)
        parts: list[RenderableType] = [head, Text(""), sinks]
        if tree is not None:
            parts += [Text(""), _tree(tree)]
        panels.append(Panel(Group(*parts), title=name))
    return Group(*panels)


def run(api: str, interval: float = 1.0, once: bool = False, console: Console | None = None) -> int:
    """Poll ``api`` every ``interval`` seconds and redraw until Ctrl-C (or one frame with ``once``)."""
    console = console or Console()
    with httpx.Client(base_url=api, timeout=10) as client:
        try:
            before = poll(client)
        except httpx.HTTPError as exc:
            console.print(f"cannot reach the deltaforge API at {api}: {exc}", style="red")
            return 2
        if once:
            time.sleep(interval)  # a rate needs two samples
            console.print(render(poll(client), before))
            return 0
        with Live(render(before, None), console=console, refresh_per_second=4, screen=False) as live:
            try:
                while True:
                    time.sleep(interval)
                    now = poll(client)
                    live.update(render(now, before))
                    before = now
            except KeyboardInterrupt:
                return 0
            except httpx.HTTPError as exc:
                console.print(f"lost the deltaforge API at {api}: {exc}", style="red")
                return 2
