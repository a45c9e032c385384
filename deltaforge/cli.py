"""Command line: serve, validate, schema, checkpoints, logs."""

from __future__ import annotations

# isort: off
import deltaforge.leanstart  # noqa: F401  (before anything imports structlog)

# isort: on
import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from deltaforge import argfiles, gctune, logsetup, waiting
from deltaforge.api.listen import TOKEN_ENV, bind, bound_addr, listen_addr, unsafe_bind
from deltaforge.checkpointcmd import cmd_checkpoints
from deltaforge.config import ConfigError, PipelineConfig, load, parse_pipeline
from deltaforge.defaults import default_pipeline
from deltaforge.logrepeats import say_overdue
from deltaforge.pipeline.runner import PipelineRunner
from deltaforge.pipeline.tree import MissingExtra
from deltaforge.plugins import SOURCES
from deltaforge.redact import redact
from deltaforge.service.client import VERBS as PIPELINE_VERBS
from deltaforge.sources import childproc
from deltaforge.sources.turso.config import TursoSourceConfig
from deltaforge.sources.turso.workload import DemoWorkload

if TYPE_CHECKING:
    from deltaforge.service.manager import PipelineManager


def _stopping() -> list[signal.Signals]:
    """Signals that stop ``serve`` with a drain. SIGHUP too: a terminal closed under ``serve`` (an
    SSH session that ended) killed it outright, buffered batches undelivered and its decoder
    children left to notice alone; nothing reloads on it. Not when it is ignored as ``serve``
    starts (``nohup``): a handler would undo what its user asked for."""
    hup = [] if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else [signal.SIGHUP]
    return [signal.SIGTERM, signal.SIGINT, *hup]


def _workload(cfg: PipelineConfig, allowed: bool) -> DemoWorkload | None:
    settings = cfg.source.config
    if not allowed or not isinstance(settings, TursoSourceConfig):
        return None
    w = settings.workload
    if w is None or not w.enabled:
        return None
    return DemoWorkload(settings.path, w.rows_per_second, w.max_rows)


REPEATS_EVERY_S = 5.0
"""How often serve looks for library repeats whose minute is over."""


async def _serve(
    configs: list[PipelineConfig],
    api_addr: str,
    workload: bool = True,
    metrics_addr: str | None = None,
    token: str | None = None,
    data_dir: str = "./data",
) -> int:
    from deltaforge.service.manager import PipelineManager
    from deltaforge.service.registry import PipelineRegistry

    log = structlog.get_logger().bind(actor="cli")
    wanted = [("REST API", api_addr, "api_listening")] if api_addr != "off" else []
    if metrics_addr:
        wanted.append(("metrics", metrics_addr, "metrics_listening"))
    bound: list[tuple[str, str, str, list[socket.socket]]] = []
    for what, addr, event in wanted:
        try:
            bound.append((what, addr, event, bind(addr)))
        except OSError as exc:  # before any pipeline starts: nothing to drain
            log.error("api_failed", reason=f"cannot serve the {what} on {addr}: {exc.strerror or exc}")
            _close_all(bound)
            return 2
    registry = PipelineRegistry(Path(data_dir) / "pipelines.json")
    manager = PipelineManager(registry, lambda c: PipelineRunner(c, workload=_workload(c, workload)))
    for c in configs:
        manager.add(c)
    manager.restore()  # the pipelines created over REST before
    runners = manager.pipelines
    stop = asyncio.Event()
    stopped_by: list[str] = []  # the signal's name, for the log
    loop = asyncio.get_running_loop()

    def stopping(sig: signal.Signals) -> None:
        stopped_by.append(sig.name)
        stop.set()

    for sig in _stopping():
        loop.add_signal_handler(sig, stopping, sig)
    waiting.install(loop)  # kill -USR1: what every task and thread waits on, logged
    manager.start_all()
    await asyncio.sleep(0)  # the pipelines begin opening their sources before the web stack loads
    from deltaforge.api import build_app, build_metrics_app
    from deltaforge.api.server import serve_on

    servers: list[tuple[Any, asyncio.Task[None]]] = []
    status = 0
    for what, addr, event, socks in bound:
        app = build_app(runners, token, manager) if what == "REST API" else build_metrics_app(runners)
        started = await serve_on(app, socks)
        if started is None:
            log.error("api_failed", reason=f"cannot serve the {what} on {addr}")
            status = 2
            stop.set()
            break
        servers.append(started)
        log.info(event, addr=bound_addr(socks))  # port 0: the one chosen
    bars = None
    if sys.stderr.isatty():  # a person watching: draw snapshot progress
        from deltaforge.snapshot.terminal import SnapshotProgress

        bars = asyncio.create_task(SnapshotProgress(runners).run())
    repeats = asyncio.create_task(_say_library_repeats())
    await stop.wait()
    if bars is not None:
        bars.cancel()
    log.info(
        "shutdown_requested",
        reason="signal" if status == 0 else "api_failed",
        signal=next(iter(stopped_by), None),
    )
    await _drain_unless_hurried(manager, log)
    for server, task in servers:
        server.should_exit = True
        await task
    _close_all(bound)  # uvicorn closes what it served; these are the rest
    repeats.cancel()
    say_overdue(structlog.get_logger(), everything=True)
    log.info("shutdown_complete")
    return status


async def _say_library_repeats() -> None:
    """The counts of library lines held back that no later line reported (an outage over within
    the minute), each said once its minute is over (``logrepeats``)."""
    while True:
        await asyncio.sleep(REPEATS_EVERY_S)
        say_overdue(structlog.get_logger())


async def _drain_unless_hurried(manager: PipelineManager, log: Any) -> None:
    """Drain every pipeline; a second stopping signal stops them at once instead (a drain can wait
    up to 30 s for a sink that is down, and whoever presses Ctrl-C twice means it)."""
    loop = asyncio.get_running_loop()
    hurry = asyncio.Event()
    for sig in _stopping():
        loop.add_signal_handler(sig, hurry.set)
    drain = asyncio.create_task(manager.drain_all())
    hurried = asyncio.create_task(hurry.wait())
    await asyncio.wait({drain, hurried}, return_when=asyncio.FIRST_COMPLETED)
    hurried.cancel()
    if not drain.done():
        log.warning("drain_skipped", reason="a second signal: stopping without delivering what is buffered; "
                    "checkpoints stay at the last delivered batch, the next start reads the rest")  # fmt: skip
        manager.stop_all_now()
    await drain


def _close_all(bound: list[tuple[str, str, str, list[socket.socket]]]) -> None:
    for *_, socks in bound:
        for sock in socks:
            sock.close()


def _api_token(args: argparse.Namespace) -> str | None:
    """The API token: ``--api-token-file`` (its first line), else ``DELTAFORGE_API_TOKEN``."""
    if args.api_token_file:
        return argfiles.token(args.api_token_file, "--api-token-file")
    return os.environ.get(TOKEN_ENV) or None


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        return _serve_configured(args)
    finally:
        childproc.discard_prestarted()  # those no decoder took (``earlystart`` may guess wrong)


def _serve_configured(args: argparse.Namespace) -> int:
    logsetup.configure(args.log_level, args.log_file, stderr=not args.quiet)
    try:
        if args.config:
            configs = load(args.config)
        else:
            configs = [
                parse_pipeline(
                    default_pipeline(args.data_dir, workload=not args.no_workload),
                    source_name="default pipeline",
                )
            ]
    except ConfigError as exc:
        print(redact(str(exc)), file=sys.stderr)
        return 2
    token = _api_token(args)
    if args.api_addr != "off" and (why := unsafe_bind(args.api_addr, token)):
        print(why, file=sys.stderr)
        return 2
    _prestart_decoders(configs)
    gctune.tune()
    try:
        return asyncio.run(
            _serve(configs, args.api_addr, not args.no_workload, args.metrics_addr, token, args.data_dir)
        )
    except MissingExtra as exc:
        structlog.get_logger().error("pipeline_cannot_start", actor="cli", reason=str(exc))
        print(redact(str(exc)), file=sys.stderr)
        return 2


def _prestart_decoders(configs: list[PipelineConfig]) -> None:
    """Start the decoder child of every pipeline whose source has one, now, unless ``python -m
    deltaforge`` started it already from the YAML alone (``earlystart.py``): each takes 100 ms
    or more to start Python and import its libraries, which then overlaps serve's own start-up
    instead of delaying the first event after it. From the main thread (PR_SET_PDEATHSIG)."""
    wanted = Counter(SOURCES[c.source.type].decoder for c in configs)
    for module, count in wanted.items():
        if module is not None:
            early = childproc.prestarted(module)[:count]
            pids = early + childproc.prestart(module, count - len(early))
            structlog.get_logger().info(
                "decoders_prestarted", actor="cli", module=module, pids=pids, before_imports=len(early)
            )


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        configs = load(args.file)
    except ConfigError as exc:
        print(redact(str(exc)), file=sys.stderr)
        return 1
    for c in configs:
        print(f"ok: pipeline {c.name!r}: {c.source.type} -> {', '.join(f'{s.type}:{s.id}' for s in c.sinks)}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from deltaforge.schema import pipeline_schema

    text = json.dumps(pipeline_schema(), indent=2) + "\n"
    if args.output:
        argfiles.write(args.output, text, "--output")
    else:
        sys.stdout.write(text)
    return 0


def _client_token(args: argparse.Namespace) -> str | None:
    """The token a CLI command sends: ``--token-file`` (its first line), else ``DELTAFORGE_API_TOKEN``."""
    if args.token_file:
        return argfiles.token(args.token_file, "--token-file")
    return os.environ.get(TOKEN_ENV) or None


def cmd_pipelines(args: argparse.Namespace) -> int:
    from deltaforge.service import client

    token = _client_token(args)
    return client.run(args.api, token, args.verb, args.name, args.file, args.delete_checkpoints)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from deltaforge.service import client

    token = _client_token(args)
    return client.snapshot(args.api, token, args.pipeline, args.tables)


def cmd_top(args: argparse.Namespace) -> int:
    from deltaforge import top

    return top.run(args.api, args.interval, once=args.once)


def cmd_logs(args: argparse.Namespace) -> int:
    from deltaforge import logview

    color = True if args.color == "always" else False if args.color == "never" else None
    return logview.run(args.file, args.follow, args.pipeline, args.actor, args.level, color, args.event or ())


def _addr(value: str) -> str:
    try:
        return listen_addr(value)
    except ValueError as exc:  # argparse shows only an ArgumentTypeError's own words
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deltaforge", description="Change data capture on supervised actors.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run pipelines (the built-in default when no --config)")
    s.add_argument("--config", help="a pipeline YAML file or a folder of them")
    s.add_argument("--api-addr", default="127.0.0.1:8080", type=_addr, help="REST API host:port, or 'off'")
    s.add_argument(
        "--api-token-file",
        help=f"a file holding the API token (else ${TOKEN_ENV}); changes then need Authorization: Bearer",
    )
    s.add_argument(
        "--metrics-addr",
        type=_addr,
        help="also serve /metrics alone on this host:port (it is on the API too)",
    )
    s.add_argument("--data-dir", default="./data", help="where the default pipeline keeps its files")
    s.add_argument("--no-workload", action="store_true", help="do not run the built-in demo workload")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-file", help="also append JSON logs to this file")
    s.add_argument("--quiet", action="store_true", help="no JSON logs on stderr")
    s.set_defaults(fn=cmd_serve)

    v = sub.add_parser("validate", help="check a pipeline config; list every wrong field")
    v.add_argument("file")
    v.set_defaults(fn=cmd_validate)

    sc = sub.add_parser("schema", help="print the JSON Schema of a pipeline document (for editors)")
    sc.add_argument("-o", "--output", help="write it to this file instead of stdout")
    sc.set_defaults(fn=cmd_schema)

    c = sub.add_parser(
        "checkpoints", help="list checkpoints, their versions, roll one back, or forget a sink's"
    )
    c.add_argument("--storage-path", default="./data/deltaforge.db")
    c.add_argument("--storage-type", default="sqlite", choices=["sqlite", "file"])
    c.add_argument("--versions", metavar="KEY", help="list the versions of one checkpoint")
    c.add_argument("--rollback", metavar="KEY", help="make an older version current")
    c.add_argument("--to", type=int, metavar="VERSION")
    c.add_argument("--forget", metavar="KEY", nargs="+",
                   help="drop sinks' checkpoints (stopped pipeline): each is a sink added at the next start")  # fmt: skip
    c.set_defaults(fn=cmd_checkpoints)

    pl = sub.add_parser("pipelines", help="list, get, create, patch, pause, resume, stop or delete pipelines")
    pl.add_argument("verb", choices=PIPELINE_VERBS)
    pl.add_argument("name", nargs="?", help="the pipeline (all verbs but list and create)")
    pl.add_argument(
        "-f", "--file", help="the document for create (YAML or JSON) or the merge patch; - for stdin"
    )
    pl.add_argument("--delete-checkpoints", action="store_true", help="delete: forget its checkpoints too")
    pl.add_argument("--api", default="http://127.0.0.1:8080", help="the serve's API (its --api-addr)")
    pl.add_argument("--token-file", help=f"a file holding the API token (else ${TOKEN_ENV})")
    pl.set_defaults(fn=cmd_pipelines)

    sn = sub.add_parser("snapshot", help="snapshot tables of a running pipeline while it streams")
    sn.add_argument("pipeline")
    sn.add_argument(
        "tables", nargs="+", metavar="table", help="db.table (MySQL) or schema.table (PostgreSQL)"
    )
    sn.add_argument("--api", default="http://127.0.0.1:8080", help="the serve's API (its --api-addr)")
    sn.add_argument("--token-file", help=f"a file holding the API token (else ${TOKEN_ENV})")
    sn.set_defaults(fn=cmd_snapshot)

    tp = sub.add_parser("top", help="a live view of a running serve: rates, lag, sinks, DLQ, the actor tree")
    tp.add_argument("--api", default="http://127.0.0.1:8080", help="the serve's API (its --api-addr)")
    tp.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    tp.add_argument("--once", action="store_true", help="print one frame (two samples apart) and exit")
    tp.set_defaults(fn=cmd_top)

    lg = sub.add_parser("logs", help="show JSON logs readably (from FILE or stdin)")
    lg.add_argument("file", nargs="?")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("--pipeline")
    lg.add_argument("--actor")
    lg.add_argument("--level", choices=["debug", "info", "warning", "error"])
    lg.add_argument("--event", action="append", help="only events of this name (repeat for more)")
    lg.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    lg.set_defaults(fn=cmd_logs)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
