"""The private test servers' harness: a server is up only once its own process holds its port.

Between ``free_port()`` and a server's bind, another xdist worker's server can take the port.
A readiness check that only connects then passed against that other server, and the test ran
against it (``tests/servers/base.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.serve_proc import free_port
from tests.servers.base import PortTaken, forget_orphans, holds_port
from tests.servers.redis import Redis

REPO = Path(__file__).resolve().parent.parent


def server_pid(server: Redis) -> int:
    return int(server.client().info("server")["process_id"])


@contextmanager
def listening(port: int) -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        yield s


def test_holds_port_names_the_process_that_listens() -> None:
    with listening(0) as s:
        port = s.getsockname()[1]
        assert holds_port(os.getpid(), port)
        assert not holds_port(os.getppid(), port)
    assert not holds_port(os.getpid(), port)


def test_a_server_whose_port_another_server_took_starts_on_another() -> None:
    with Redis() as first:
        second = Redis()
        second.port = first.port  # taken by the first between picking it and binding it
        with second:
            assert second.port != first.port
            assert second.proc is not None and server_pid(second) == second.proc.pid
            assert first.proc is not None and server_pid(first) == first.proc.pid


def test_a_server_started_again_keeps_its_port_and_says_it_is_taken() -> None:
    with Redis() as server:
        port = server.port
        server.kill()
        with listening(port), pytest.raises(PortTaken, match=f"port {port} is held by another process"):
            server.start()
        assert server.port == port
        server.start()  # free again: the same port
        assert server.port == port and server.proc is not None and server_pid(server) == server.proc.pid


def test_free_ports_come_from_below_the_ephemeral_range_where_no_outgoing_connection_lands() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    # An outgoing connection's source port: the kind of taker free_port() keeps out of its way.
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as c,
    ):
        assert c.getsockname()[1] >= low
        ports = {free_port() for _ in range(50)}
    assert all(10000 <= p < low for p in ports)
    assert len(ports) > 40  # spread at random, not handed out in sequence
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free: nothing was left holding it


def test_a_cluster_node_whose_bus_port_was_taken_starts_on_another() -> None:
    """A Redis Cluster node binds its port plus 10,000 too (the cluster bus). Taken by another
    listener, the node exited and the harness said only "redis did not start" (seen in CI); it now
    sees the bus port held and starts on another port, whose bus port lies below the ephemeral
    range, where no outgoing connection lands."""
    node = Redis(cluster=True)
    taken = node.port
    assert taken + 10_000 < int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    with listening(taken + 10_000), node:
        assert node.port != taken
        assert node.proc is not None and server_pid(node) == node.proc.pid
        assert node.client().info("cluster")["cluster_enabled"] == 1


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture()
def temp_root() -> Iterator[Path]:
    """A temp dir of its own for a test process's servers (not pytest's: the postgres user may
    not enter that one)."""
    root = Path(tempfile.mkdtemp(prefix="df-harness-test-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_servers_of_a_test_process_killed_are_stopped_and_their_files_removed(temp_root: Path) -> None:
    """A test run SIGKILLed runs no teardown: its servers ran on and their data stayed in the temp
    dir until someone noticed. The next session's sweep stops them: Tansu (found by the pid its
    folder noted: nothing of the folder is in its command line), PostgreSQL (pg_ctl started it,
    no pid of it noted: found by its folder in its command line) and Redis (its pid noted; it
    rewrites its command line)."""
    code = (
        "import sys\n"
        "from tests.servers.postgres import Postgres\n"
        "from tests.servers.redis import Redis\n"
        "from tests.servers.tansu import Tansu\n"
        "r, t, p = Redis().start(), Tansu().start(), Postgres().start()\n"
        "print(r.proc.pid, t.proc.pid, p.server_pid(), r.dir, t.dir, p.dir, flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "TMPDIR": str(temp_root)}
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert len(line) == 6, "the servers did not start"
        pids, dirs = [int(p) for p in line[:3]], line[3:]
        assert all(map(running, pids))
        assert forget_orphans(temp_root) == [], "its owner still runs: nothing is an orphan yet"
        assert all(map(running, pids))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert all(map(running, pids)), "a killed owner's servers run on (what the sweep is for)"
        assert sorted(forget_orphans(temp_root)) == sorted(Path(d) for d in dirs)
        deadline = time.monotonic() + 10  # SIGKILL sent: each one's exit, bounded
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(running, pids))
        assert not any(Path(d).exists() for d in dirs)
    finally:
        child.kill()
        child.wait(10)
        forget_orphans(temp_root)


def test_a_server_whose_owner_runs_is_left_alone(tmp_path: Path) -> None:
    with Redis() as server:
        assert server.dir not in forget_orphans(server.dir.parent)
        assert server.client().ping()
        assert server.dir.exists()
