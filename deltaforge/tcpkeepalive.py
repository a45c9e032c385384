"""TCP keepalive on a client's socket, so that a server whose host vanished is noticed.

A host that lost its power or its network, or a NAT that forgot the connection, sends nothing:
no reset, no FIN. A question that may rightly run for hours (creating a replication slot waits
for the transactions running then; advancing or peeking a slot decodes the WAL in between) has
no timeout that tells such a host from a busy server, and without keepalive the kernel's
defaults (two hours idle, then eleven minutes of probes) are what would. With these, the
connection fails after :data:`IDLE_S` of silence and :data:`COUNT` unanswered probes
:data:`INTERVAL_S` apart, while a busy server's kernel answers every probe. TCP_USER_TIMEOUT
bounds the other case the same way: data sent and never acknowledged (no probe goes out while
data waits for its acknowledgement, and retransmissions last about fifteen minutes).
"""

from __future__ import annotations

import socket
from typing import Any

IDLE_S = 10
INTERVAL_S = 5
COUNT = 3


def bound_s() -> int:
    """How long a silent host takes to be noticed."""
    return IDLE_S + INTERVAL_S * COUNT


def keep_alive(sock: Any) -> None:
    """Keepalive on ``sock`` (a socket, or asyncio's ``TransportSocket``), where the platform has
    the options (Linux has all of them)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", IDLE_S),
        ("TCP_KEEPINTVL", INTERVAL_S),
        ("TCP_KEEPCNT", COUNT),
        ("TCP_USER_TIMEOUT", bound_s() * 1000),
    ):
        if (option := getattr(socket, name, None)) is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def keep_asyncpg_alive(conn: Any) -> None:
    """Keepalive on an asyncpg connection's socket (a unix socket needs none). asyncpg has no
    setting for it (MagicStack/asyncpg#606, open since 2020); its transport is the way in."""
    sock = conn._transport.get_extra_info("socket")  # private: see above
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        keep_alive(sock)
