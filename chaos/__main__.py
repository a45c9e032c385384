"""``python -m chaos proxy [--host H] [--port P]``: the Toxiproxy-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy", help="run the Toxiproxy-compatible proxy server")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=8474)
    args = parser.parse_args(argv)
    if args.command == "proxy":
        from chaos.proxy.api import serve

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.host, args.port))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
