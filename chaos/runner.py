"""Running scenarios: each gets its own folder, the shared proxy server and a seed, and returns
a :class:`Result` whose figures the report shows. A scenario raises :class:`Failed` (or any
error) when a guarantee does not hold."""

from __future__ import annotations

import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaos.harness import ProxyServer


class Failed(AssertionError):
    """A guarantee did not hold; the message says which and by how much."""


@dataclass
class RunContext:
    """What a scenario is given."""

    workdir: Path
    proxies: ProxyServer
    seed: int
    duration: float | None
    figures: dict[str, Any] = field(default_factory=dict)
    """What the scenario measured (events lost, time to recover, ...): the report's columns."""

    def pipeline(self, name: str, spec: dict[str, Any]) -> Path:
        """Write a pipeline document into the scenario's folder."""
        doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": name}, "spec": spec}
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def expect(self, what: str, got: Any, want: Any) -> None:
        """Record ``what`` and fail unless it is ``want``."""
        self.figures[what] = got
        if got != want:
            raise Failed(f"{what}: {got} (expected {want})")


@dataclass(frozen=True)
class Scenario:
    """One chaos scenario: the fault it injects and what it asserts (for ``list`` and the README)."""

    name: str
    fault: str
    asserts: str
    run: Callable[[RunContext], None] | None
    pending: str | None = None
    """The issue whose feature it waits for: listed, never silently missing."""
    quick: bool = False
    """Part of the CI subset."""
    toxics: tuple[str, ...] = ()
    """The faults it injects: toxic types, ``down`` (a disabled proxy), ``kill`` (SIGKILL), ``stop``
    (SIGSTOP)."""


@dataclass
class Result:
    name: str
    status: str  # passed, failed, pending
    seconds: float
    figures: dict[str, Any]
    detail: str = ""
    logs: str = ""


def scenario_dir(root: Path, name: str) -> Path:
    """``root/name``, made empty: what an earlier run of the scenario left there (its checkpoints
    above all, which the new run's ``serve`` would resume from, against servers started afresh)
    must not be read as this run's."""
    workdir = root / name
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    return workdir


def tidy(root: Path, results: list[Result]) -> None:
    """``root`` made for this run alone (no ``--workdir``): the folders of the scenarios that did
    not fail are removed, and ``root`` with them once nothing is left in it; those of the ones
    that failed stay for their logs. Every CI run left one in ``/tmp`` (57 MB, mostly the sinks'
    events)."""
    for r in results:
        if r.status != "failed" and r.logs:
            shutil.rmtree(r.logs, ignore_errors=True)
            r.logs = ""
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()


def run_one(
    scenario: Scenario, root: Path, proxies: ProxyServer, seed: int, duration: float | None
) -> Result:
    if scenario.run is None:
        return Result(scenario.name, "pending", 0.0, {}, scenario.pending or "")
    workdir = scenario_dir(root, scenario.name)
    ctx = RunContext(workdir, proxies, seed, duration)
    start = time.monotonic()
    try:
        scenario.run(ctx)
        status, detail = "passed", ""
    except Exception as exc:  # noqa: BLE001 - any failure fails this scenario, not the run
        status = "failed"
        detail = str(exc) if isinstance(exc, Failed) else "".join(traceback.format_exception(exc))[-3000:]
    finally:
        for proxy in list(proxies.client.proxies().values()):
            proxy.destroy()
    return Result(
        scenario.name, status, round(time.monotonic() - start, 1), ctx.figures, detail, str(workdir)
    )
