"""A host of its own for a test server, behind a link the test can cut: a network namespace
joined to this one by a veth pair.

A proxy in user space cannot stage what a real network does when a host vanishes (its power
cut, a cable pulled, a NAT that forgot the connection): the proxy's kernel still answers TCP,
keepalive probes included. Here nothing answers: :meth:`Link.cut` takes the namespace's end of
the pair down, and every packet either side sends is dropped without a word, as on the wire.
Needs root and ``ip`` (iproute2), as the CI has.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
from typing import Self

PREFIX = "df-link-"


def forget_orphans() -> None:
    """Remove the links of test processes that are gone (SIGKILLed: no teardown ran), with
    whatever still runs in them (a PostgreSQL server). Nothing to do without ``ip``."""
    if shutil.which("ip") is None:
        return
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for name in (line.split(" ", 1)[0] for line in listed.stdout.splitlines()):
        if not name.startswith(PREFIX):
            continue
        try:
            os.kill(int(name.removeprefix(PREFIX).split("-")[0]), 0)
            continue  # its test process still runs
        except ProcessLookupError:
            pass
        except ValueError:
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.decode(errors='replace')}")


class Link:
    """A namespace ``name`` whose address :attr:`there` this host reaches at :attr:`here`'s side
    of a point-to-point link; :meth:`run_in` is the command prefix for a process living there."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100_000}{random.randrange(100)}"
        self.name = f"{PREFIX}{os.getpid()}-{tag}"  # the pid: see forget_orphans
        self._ours, self._theirs = f"dfh{tag}", f"dfn{tag}"  # interface names: 15 bytes at most
        # A /30 in 10.200.0.0/16 drawn at random: two links alive at once (two xdist workers, a
        # chaos run beside them) share one once in 16,384.
        net = f"10.200.{random.randrange(256)}"
        last = random.randrange(64) * 4
        self.here, self.there = f"{net}.{last + 1}", f"{net}.{last + 2}"

    def __enter__(self) -> Self:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self._ours, "type", "veth", "peer", "name", self._theirs)
            _ip("link", "set", self._theirs, "netns", self.name)
            _ip("addr", "add", f"{self.here}/30", "dev", self._ours)
            _ip("link", "set", self._ours, "up")
            self._inside("addr", "add", f"{self.there}/30", "dev", self._theirs)
            self._inside("link", "set", self._theirs, "up")
            self._inside("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _inside(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    def run_in(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Nothing crosses the link any more, and neither side is told."""
        self._inside("link", "set", self._theirs, "down")

    def mend(self) -> None:
        """Traffic crosses again. The neighbour entry the cut left failed is forgotten: while it
        stands, a connection is refused at once (EHOSTUNREACH) rather than sent."""
        self._inside("link", "set", self._theirs, "up")
        _ip("neigh", "flush", "dev", self._ours)

    def close(self) -> None:
        """The namespace gone, and with it both ends of the pair (processes still in it are the
        caller's to stop first)."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self._ours], capture_output=True, timeout=30)
