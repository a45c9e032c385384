"""Conformance of ``python -m chaos proxy`` with Toxiproxy: the unchanged toxiproxy-python client
drives it, raw HTTP checks codes and bodies, and real TCP traffic checks every toxic. When a real
``toxiproxy-server`` is on PATH the same tests run against it instead."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.harness import ProxyServer
from tests.serve_proc import free_port


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionResetError:
            pass  # the reset_peer toxic's doing: expected, not a traceback in the test output


class _Blob(socketserver.BaseRequestHandler):
    """Sends ``server.blob`` and closes."""

    def handle(self) -> None:
        self.request.sendall(self.server.blob)  # type: ignore[attr-defined]


class Upstream:
    """A threaded TCP server on a free port."""

    def __init__(self, handler: type[socketserver.BaseRequestHandler], blob: bytes = b"") -> None:
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.server.blob = blob  # type: ignore[attr-defined]
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    """The proxy server's URL: a real toxiproxy-server when one is on PATH, else ``chaos proxy``."""
    server = ProxyServer()
    try:
        yield f"http://{server.host}:{server.port}"
    finally:
        server.close()


@pytest.fixture()
def client(api: str) -> Iterator[Toxiproxy]:
    tp = Toxiproxy()
    tp.destroy_all()
    yield tp
    tp.destroy_all()


@pytest.fixture()
def echo() -> Iterator[Upstream]:
    server = Upstream(_Echo)
    yield server
    server.close()


def connect(proxy: Any, timeout: float = 10) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def round_trip(sock: socket.socket, data: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        got += chunk
    assert got == data
    return time.monotonic() - start


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


# -- the HTTP API: codes and bodies -------------------------------------------------------


def test_codes_and_error_bodies_are_toxiproxys(api: str, client: Toxiproxy, echo: Upstream) -> None:
    body = {"name": "p", "upstream": echo.address, "listen": "127.0.0.1:0"}
    created = httpx.post(api + "/proxies", json=body)
    assert created.status_code == 201
    assert created.json()["name"] == "p" and created.json()["enabled"] is True
    assert created.json()["listen"] != "127.0.0.1:0"  # the port it bound
    again = httpx.post(api + "/proxies", json=body)
    assert again.status_code == 409 and again.json() == {"error": "proxy already exists", "status": 409}
    missing = httpx.get(api + "/proxies/nope")
    assert missing.status_code == 404 and missing.json() == {"error": "proxy not found", "status": 404}
    no_upstream = httpx.post(api + "/proxies", json={"name": "q"})
    assert no_upstream.status_code == 400 and no_upstream.json()["error"].startswith("missing required field")
    toxic = httpx.post(api + "/proxies/p/toxics", json={"type": "latency", "attributes": {"latency": 5}})
    assert toxic.status_code == 200
    assert toxic.json() == {"attributes": {"latency": 5, "jitter": 0}, "name": "latency_downstream",
                            "type": "latency", "stream": "downstream", "toxicity": 1.0}  # fmt: skip
    dup = httpx.post(api + "/proxies/p/toxics", json={"type": "latency"})
    assert dup.status_code == 409 and dup.json() == {"error": "toxic already exists", "status": 409}
    bad = httpx.post(api + "/proxies/p/toxics", json={"type": "nosuch"})
    assert bad.status_code == 400 and bad.json() == {"error": "invalid toxic type", "status": 400}
    stream = httpx.post(api + "/proxies/p/toxics", json={"type": "latency", "stream": "sideways"})
    assert stream.status_code == 400 and "upstream or downstream" in stream.json()["error"]
    patched = httpx.patch(api + "/proxies/p/toxics/latency_downstream", json={"attributes": {"latency": 9}})
    assert patched.status_code == 200 and patched.json()["attributes"]["latency"] == 9
    assert httpx.get(api + "/proxies/p/toxics/latency_downstream").json()["attributes"]["latency"] == 9
    assert httpx.delete(api + "/proxies/p/toxics/latency_downstream").status_code == 204
    gone = httpx.delete(api + "/proxies/p/toxics/latency_downstream")
    assert gone.status_code == 404 and gone.json() == {"error": "toxic not found", "status": 404}
    down = httpx.patch(api + "/proxies/p", json={"enabled": False})
    assert down.status_code == 200 and down.json()["enabled"] is False
    assert httpx.post(api + "/reset").status_code == 204
    assert httpx.get(api + "/proxies/p").json()["enabled"] is True  # reset enables every proxy
    populated = httpx.post(api + "/populate", json=[{"name": "p", "upstream": echo.address},
                                                   {"name": "r", "upstream": echo.address}])  # fmt: skip
    assert populated.status_code == 201 and [p["name"] for p in populated.json()["proxies"]] == ["p", "r"]
    assert set(httpx.get(api + "/proxies").json()) == {"p", "r"}
    assert httpx.get(api + "/version").json()["version"]
    browser = httpx.get(api + "/proxies", headers={"User-Agent": "Mozilla/5.0"})
    assert browser.status_code == 403
    assert httpx.delete(api + "/proxies/r").status_code == 204
    assert httpx.delete(api + "/proxies/r").status_code == 404


def test_the_unchanged_client_manages_proxies_and_every_toxic_type(client: Toxiproxy, echo: Upstream) -> None:
    proxy = client.create(upstream=echo.address, name="db")
    with pytest.raises(ProxyExists):
        client.create(upstream=echo.address, name="db")
    kinds = {
        "latency": {"latency": 10, "jitter": 2},
        "bandwidth": {"rate": 1000},
        "slow_close": {"delay": 10},
        "timeout": {"timeout": 0},
        "reset_peer": {"timeout": 0},
        "slicer": {"average_size": 64, "size_variation": 8, "delay": 10},
        "limit_data": {"bytes": 1000},
    }
    for kind, attributes in kinds.items():
        proxy.add_toxic(type=kind, attributes=attributes, stream="upstream", toxicity=0.5)
    toxics = proxy.toxics()
    assert set(toxics) == {f"{k}_upstream" for k in kinds}
    assert {name: t.attributes for name, t in toxics.items()} == {
        f"{k}_upstream": a for k, a in kinds.items()
    }
    assert all(t.toxicity == 0.5 for t in toxics.values())
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="nosuch")
    for name in toxics:
        proxy.destroy_toxic(name)
    assert proxy.toxics() == {}
    assert set(client.proxies()) == {"db"}
    with proxy.down():
        assert client.get_proxy("db").enabled is False
    assert client.get_proxy("db").enabled is True
    assert round_trip(connect(proxy)) >= 0
    proxy.destroy()
    with pytest.raises(NotFound):
        proxy.destroy()


# -- real TCP traffic through each toxic ------------------------------------------------------


def test_latency_delays_each_direction_it_is_set_on(client: Toxiproxy, echo: Upstream) -> None:
    proxy = client.create(upstream=echo.address, name="lat")
    sock = connect(proxy)
    base = round_trip(sock)
    proxy.add_toxic(type="latency", attributes={"latency": 300, "jitter": 0})
    slow = round_trip(sock)  # an open connection gets a new toxic
    proxy.add_toxic(type="latency", stream="upstream", name="up", attributes={"latency": 200})
    slower = round_trip(sock)
    assert 0.3 <= slow < 0.3 + 1.0, slow
    assert 0.5 <= slower < 0.5 + 1.0, slower
    proxy.destroy_toxic("latency_downstream")
    proxy.destroy_toxic("up")
    assert round_trip(sock) < 0.3 + base


def test_toxicity_zero_never_applies(client: Toxiproxy, echo: Upstream) -> None:
    proxy = client.create(upstream=echo.address, name="tox")
    proxy.add_toxic(type="latency", attributes={"latency": 2000}, toxicity=0.0)
    assert round_trip(connect(proxy)) < 2.0


def test_bandwidth_paces_the_stream(client: Toxiproxy) -> None:
    blob = bytes(range(256)) * 1200  # 307,200 bytes
    source = Upstream(_Blob, blob)
    try:
        proxy = client.create(upstream=source.address, name="bw")
        proxy.add_toxic(type="bandwidth", attributes={"rate": 200})  # 200 KB/s: about 1.5 s
        start = time.monotonic()
        got = read_all(connect(proxy))
        took = time.monotonic() - start
    finally:
        source.close()
    assert got == blob
    assert 1.3 <= took < 1.54 + 2.0, took


def test_reset_peer_is_seen_as_a_reset_by_the_client(client: Toxiproxy, echo: Upstream) -> None:
    proxy = client.create(upstream=echo.address, name="rst")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100}, stream="upstream")
    sock = connect(proxy)
    sock.sendall(b"hello")
    with pytest.raises(ConnectionResetError):
        sock.recv(10)


def test_timeout_zero_drops_data_until_removed_then_a_timeout_closes(
    client: Toxiproxy, echo: Upstream
) -> None:
    proxy = client.create(upstream=echo.address, name="to")
    sock = connect(proxy, timeout=0.5)
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    sock.sendall(b"lost")
    with pytest.raises(TimeoutError):  # held: nothing arrives, the connection stays open
        sock.recv(10)
    proxy.destroy_toxic("timeout_downstream")
    sock.settimeout(10)
    assert round_trip(sock, b"after") >= 0  # what it dropped is gone; new data passes again
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    start = time.monotonic()
    assert sock.recv(10) == b""  # closed by the proxy after the timeout
    assert time.monotonic() - start >= 0.25


def test_limit_data_closes_after_exactly_n_bytes(client: Toxiproxy, echo: Upstream) -> None:
    proxy = client.create(upstream=echo.address, name="lim")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 100})
    sock = connect(proxy)
    sock.sendall(bytes(1000))
    assert len(read_all(sock)) == 100


def test_slicer_delivers_every_byte_in_order_in_slices(client: Toxiproxy) -> None:
    blob = bytes(i % 251 for i in range(20_000))
    source = Upstream(_Blob, blob)
    try:
        proxy = client.create(upstream=source.address, name="sl")
        proxy.add_toxic(type="slicer", attributes={"average_size": 100, "size_variation": 40, "delay": 2000})
        sock = connect(proxy)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    finally:
        source.close()
    assert b"".join(chunks) == blob
    assert len(chunks) > 10 and max(len(c) for c in chunks) < 5000


def test_slow_close_delays_the_close(client: Toxiproxy) -> None:
    source = Upstream(_Blob, b"bye")
    try:
        proxy = client.create(upstream=source.address, name="sc")
        proxy.add_toxic(type="slow_close", attributes={"delay": 500})
        sock = connect(proxy)
        start = time.monotonic()
        assert read_all(sock) == b"bye"
        took = time.monotonic() - start
    finally:
        source.close()
    assert took >= 0.45, took


def test_disabling_drops_connections_and_refuses_new_ones(client: Toxiproxy, echo: Upstream) -> None:
    proxy = client.create(upstream=echo.address, name="dn", listen=f"127.0.0.1:{free_port()}")
    sock = connect(proxy)
    assert round_trip(sock) >= 0
    proxy.disable()
    assert sock.recv(10) == b""
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    proxy.enable()
    assert round_trip(connect(proxy)) >= 0  # listening again on the same address


def test_a_new_upstream_drops_open_connections(api: str, client: Toxiproxy, echo: Upstream) -> None:
    other = Upstream(_Echo)
    try:
        proxy = client.create(upstream=echo.address, name="up", listen=f"127.0.0.1:{free_port()}")
        sock = connect(proxy)
        assert round_trip(sock) >= 0
        assert httpx.patch(api + "/proxies/up", json={"upstream": other.address}).status_code == 200
        assert sock.recv(10) == b""
        assert round_trip(connect(proxy)) >= 0
    finally:
        other.close()
