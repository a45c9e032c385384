"""Where the API listens: the exposure check and the bound sockets, before the web stack loads.

``serve`` binds its addresses first — an address in use stops it with exit 2 before any
pipeline starts — then starts the pipelines, and only then imports uvicorn, Starlette and
prometheus-client (a tenth of a second) to serve on the sockets already bound: a restart
delivers its first event sooner, and a client that connects meanwhile waits in the listen
backlog instead of being refused. This module imports nothing of the web stack.

Example::

    >>> socks = bind("127.0.0.1:0")
    >>> socks[0].getsockname()[0]
    '127.0.0.1'
    >>> for s in socks:
    ...     s.close()
"""

from __future__ import annotations

import ipaddress
import socket

TOKEN_ENV = "DELTAFORGE_API_TOKEN"


def unsafe_bind(addr: str, token: str | None) -> str | None:
    """Why listening on ``addr`` is refused (a non-loopback address with no token), or None."""
    if token:
        return None
    host = addr.rpartition(":")[0].strip("[]") or "127.0.0.1"
    if host == "localhost":
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a name: it may resolve anywhere
    if loopback:
        return None
    return (
        f"--api-addr {addr} is not a loopback address: the API's mutating endpoints need a token there; "
        f"set {TOKEN_ENV} or --api-token-file"
    )


def listen_addr(value: str) -> str:
    """``host:port`` as ``serve --api-addr``/``--metrics-addr`` take it (``'off'`` passes): a port
    from 0 to 65535 (0: any free one). ``notanaddr`` was a ValueError traceback, and port 99999
    listened on 34463 (the resolver takes it modulo 65536) while the log said 99999.

    >>> listen_addr("[::1]:8080"), listen_addr("off")
    ('[::1]:8080', 'off')
    >>> listen_addr("127.0.0.1:99999")
    Traceback (most recent call last):
    ...
    ValueError: expected host:port with a port from 0 to 65535, got '127.0.0.1:99999'
    """
    port = value.rpartition(":")[2]
    if value != "off" and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"expected host:port with a port from 0 to 65535, got {value!r}")
    return value


def bind(addr: str) -> list[socket.socket]:
    """Listening sockets on ``host:port`` (every address the host resolves to, as asyncio's
    ``create_server`` binds); OSError if any cannot be bound, with none left open."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, where in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: v4 and v6 each get their own socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(where)
            sock.listen(2048)  # uvicorn's default backlog
            sock.setblocking(False)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def bound_addr(socks: list[socket.socket]) -> str:
    """``host:port`` of each socket as bound, comma-separated: with port 0 asked for, the port
    the system chose, which a log saying ``:0`` would keep from whoever wants to connect.

    >>> socks = bind("127.0.0.1:0")
    >>> bound_addr(socks) != "127.0.0.1:0"
    True
    >>> for s in socks:
    ...     s.close()
    """
    out = []
    for sock in socks:
        host, port = sock.getsockname()[:2]
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return ",".join(out)
