"""Running ``python -m deltaforge serve`` as a real subprocess in tests."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import wait_until_sync

LOG_TAIL = 60  # lines of serve's log printed when a test fails inside ``with Serve(...)``
WAITS = '"event":"waiting_on"'


# Not the `random` module's state, which a test may have seeded alike in every worker.
_pick = random.SystemRandom()
_LOWEST = 10000  # below: ports that services here listen on by default (3306, 5432, 6379, 9092, …)


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' source ports)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port nothing holds now, for a server a test is about to start.

    Chosen at random below the kernel's ephemeral range, not by binding port 0: the kernel hands
    its ephemeral ports to every outgoing connection's source side too, so one a parallel test
    opens between this call and the server's bind can take the port (seen in CI: ``Address already
    in use``). A port below the range is only ever taken by another bind. The harnesses still start
    a server again on another port when its port was taken (``Serve.wait_api``,
    ``ServerProcess.start``)."""
    low = ephemeral_low()
    for _ in range(200):
        port = _pick.randrange(_LOWEST, low) if low - _LOWEST >= 1000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # held, or lingering in TIME_WAIT
            return int(s.getsockname()[1])
    raise RuntimeError("no free port below the ephemeral range after 200 tries")


PYTHON_M = (sys.executable, "-m", "deltaforge")
CONSOLE_SCRIPT = (str(Path(sys.executable).parent / "deltaforge"),)
"""The two ways a user starts deltaforge: ``python -m deltaforge`` and the installed script."""


class Serve:
    """A serve process with its cwd, logs and (optionally) API port."""

    def __init__(
        self,
        cwd: Path,
        *args: str,
        api: bool = True,
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = PYTHON_M,
    ) -> None:
        self.cwd = cwd
        self.port = free_port() if api else None
        addr = f"127.0.0.1:{self.port}" if api else "off"
        # A relative --log-file is serve's, under its cwd.
        self.log = cwd / args[args.index("--log-file") + 1] if "--log-file" in args else cwd / "serve.err"
        self.stdout = open(cwd / "serve.out", "ab")  # noqa: SIM115
        self.stderr = open(cwd / "serve.err", "ab")  # noqa: SIM115
        self._spawn = (launcher, args, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.proc = self._start(addr)

    def _start(self, addr: str) -> subprocess.Popen[bytes]:
        launcher, args, env = self._spawn
        return subprocess.Popen(
            [*launcher, "serve", "--api-addr", addr, *args],
            cwd=self.cwd,
            stdout=self.stdout,
            stderr=self.stderr,
            env=env,
        )

    def _respawn(self) -> None:
        """serve again, on another free port."""
        self.port = free_port()
        self.proc = self._start(f"127.0.0.1:{self.port}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url(path), timeout=5)

    def wait_api(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                err = (self.cwd / "serve.err").read_text()
                if self.port is not None and f"127.0.0.1:{self.port}: Address already in use" in err:
                    # free_port's port taken by another process before serve bound it (the CI lane's
                    # servers start beside the tests): serve stopped before any pipeline started.
                    self._respawn()
                    return False
                raise AssertionError(f"serve exited early: {err[-2000:]}")
            try:
                return self.get("/health").status_code in (200, 503)
            except httpx.HTTPError:
                return False

        wait_until_sync(up, timeout=20, what="REST API up")

    def actor_state(self, pipeline: str, actor: str) -> str | None:
        """The state of ``actor`` in ``pipeline``'s supervisor tree, as the API shows it."""

        def find(node: dict[str, Any]) -> dict[str, Any] | None:
            if node["name"] == actor:
                return node
            return next((hit for c in node.get("children", []) if (hit := find(c))), None)

        node = find(self.get(f"/pipelines/{pipeline}/actors").json())
        return None if node is None else str(node["state"])

    def wait_source_open(self, pipeline: str, timeout: float = 60) -> None:
        """Until the pipeline's reader is up: its source is open (a PostgreSQL slot exists)."""
        wait_until_sync(
            lambda: self.actor_state(pipeline, "SourceReader") == "running", timeout, "source open"
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._close()
        return rc

    def _close(self) -> None:
        self.stdout.close()
        self.stderr.close()

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        waits = None
        if self.proc.poll() is None:
            if exc_type is not None:
                waits = self.ask_waits()
            self.kill()
        if exc_type is not None and self.log.exists():
            # A failing test shows what serve was doing (pytest prints a failed test's stdout):
            # in CI the temporary directory holding the log is gone by the time anyone looks.
            lines = [x for x in self.log.read_text(errors="replace").splitlines() if WAITS not in x]
            print(f"--- the last {min(len(lines), LOG_TAIL)} lines of {self.log.name} ---")
            print("\n".join(lines[-LOG_TAIL:]))
            if waits is not None:
                from deltaforge.logview import render

                print("--- what serve was waiting on when the test failed (SIGUSR1) ---")
                print(render(json.loads(waits)).plain)

    def ask_waits(self) -> str | None:
        """serve's answer to SIGUSR1 (``deltaforge/waiting.py``): where every task and thread of a
        serve still running when its test failed stood (a test that timed out waiting on it
        showed nothing of why). Its log line, or None when it did not answer within 10 s."""
        if not self.log.exists():
            return None
        start = self.log.stat().st_size
        self.proc.send_signal(signal.SIGUSR1)

        def said() -> str | None:
            with open(self.log, "rb") as f:
                f.seek(start)
                return next((x.decode(errors="replace") for x in f if WAITS.encode() in x), None)

        try:
            wait_until_sync(lambda: said() is not None or self.proc.poll() is not None, 10, "waiting_on")
        except AssertionError:
            return None
        return said()


def serve_pipeline(
    tmp: Path,
    spec: dict[str, Any],
    name: str = "shop",
    env: dict[str, str] | None = None,
    launcher: tuple[str, ...] = PYTHON_M,
) -> Serve:
    """Write a one-pipeline document into ``tmp``, start serve on it (logging to ``log.jsonl``) and
    wait until its source is open; a start that fails kills serve rather than leave it behind."""
    import yaml

    doc = {"apiVersion": "deltaforge/v1", "kind": "Pipeline", "metadata": {"name": name}, "spec": spec}
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    serve = Serve(tmp, "--config", str(cfg), "--log-file", str(tmp / "log.jsonl"), env=env, launcher=launcher)
    try:
        serve.wait_api()
        serve.wait_source_open(name)
    except BaseException:
        serve.kill()
        raise
    return serve
