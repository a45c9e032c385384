"""``python -m chaos``: the Toxiproxy-compatible proxy server and the chaos scenarios.

python -m chaos proxy [--host 127.0.0.1] [--port 8474]
python -m chaos list
python -m chaos run <scenario>... | all | quick [--seed N] [--duration S] [--report out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy", help="run the Toxiproxy-compatible proxy server")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=8474)
    commands.add_parser("list", help="the scenarios, with their fault and what they assert")
    run = commands.add_parser("run", help="run scenarios ('all', 'quick' (the CI subset) or names)")
    run.add_argument("scenarios", nargs="+")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--duration", type=float, default=None, help="seconds, for scenarios that take one")
    run.add_argument("--report", type=Path, default=None, help="write the results as JSON here")
    run.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep each scenario's logs here (a scenario's folder is emptied when it starts); "
        "without it only the folders of failed scenarios are kept, in a temporary folder",
    )
    args = parser.parse_args(argv)
    if args.command == "proxy":
        from chaos.proxy.api import serve

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.host, args.port))
        return 0
    from chaos.scenarios import BY_NAME, SCENARIOS

    if args.command == "list":
        from rich.console import Console
        from rich.table import Table

        table = Table(title="chaos scenarios")
        for column in ("scenario", "fault", "asserts", "CI", "status"):
            table.add_column(column, overflow="fold")
        for s in SCENARIOS:
            table.add_row(s.name, s.fault, s.asserts, "yes" if s.quick else "",
                          f"pending: {s.pending}" if s.pending else "ready")  # fmt: skip
        Console().print(table)
        return 0
    names = args.scenarios
    if names == ["all"]:
        chosen = SCENARIOS
    elif names == ["quick"]:
        chosen = [s for s in SCENARIOS if s.quick]
    else:
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            parser.error(f"unknown scenario(s) {', '.join(unknown)}; see python -m chaos list")
        chosen = [BY_NAME[n] for n in names]
    from chaos.harness import ProxyServer
    from chaos.report import show, write_json
    from chaos.runner import run_one, tidy
    from tests.servers import base, netns

    netns.forget_orphans()  # host_vanishes' links left by a run that was killed
    base.forget_orphans()  # and the servers of one
    root = args.workdir or Path(tempfile.mkdtemp(prefix="deltaforge-chaos-"))
    proxies = ProxyServer()
    results = []
    try:
        for scenario in chosen:
            print(f"== {scenario.name}", flush=True)
            results.append(run_one(scenario, root, proxies, args.seed, args.duration))
            print(f"   {results[-1].status} in {results[-1].seconds}s", flush=True)
    finally:
        proxies.close()
    if args.workdir is None:
        tidy(root, results)
    show(results)
    if args.report:
        write_json(results, args.report, args.seed)
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
