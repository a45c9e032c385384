"""Why a connection could not be made, in its error's own words and with the host a name lookup
failed for.

A sink said ``cannot connect: gaierror`` (PostgreSQL) or ``cannot connect: NoServersError``
(NATS) and nothing more, and a PostgreSQL source ``gaierror: [Errno -2] Name or service not
known``: the words of a failed lookup name no host, so a misspelt one in a DSN could only be
guessed at. What servers and drivers say goes through :func:`deltaforge.redact.redact` (an
error may quote a DSN).
"""

from __future__ import annotations

import errno
import socket
from urllib.parse import urlsplit

from deltaforge.redact import redact


def why(exc: BaseException, host: str | None = None) -> str:
    """``exc``'s class and words, credentials masked; for a name that does not resolve, the host.

    >>> why(socket.gaierror(-2, "Name or service not known"), "db.invalid")
    "gaierror: [Errno -2] Name or service not known (looking up 'db.invalid')"
    >>> why(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"))
    "ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 5432)"
    >>> why(TimeoutError())
    'TimeoutError'
    >>> try:
    ...     raise ConnectionResetError("connection was closed") from TimeoutError(110, "Connection timed out")
    ... except OSError as exc:
    ...     why(exc)
    "ConnectionResetError: connection was closed (TimeoutError: [Errno 110] Connection timed out: the server's host stopped answering)"
    """
    words = redact(str(exc))
    said = f"{type(exc).__name__}: {words}" if words else type(exc).__name__
    if host and isinstance(exc, socket.gaierror):
        said += f" (looking up {host!r})"
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.errno in _HOST_GONE:
        # How a connection ended by keepalive (tcpkeepalive.py) or by unanswered data is told:
        # the driver says the connection closed, and only its cause says why.
        said += f" ({why(cause)}: the server's host stopped answering)"
    return said


_HOST_GONE = {errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH}
"""A connection's end when nothing answered: keepalive probes or data unacknowledged (timed out),
or the neighbour's address no longer resolving on the link (unreachable)."""


def host_of(url: str) -> str | None:
    """The host a URL-form DSN names (``postgresql://u:p@db:5432/x`` → ``db``), if it names one.

    >>> host_of("postgresql://cdc:s3cret@db.internal:5432/shop")
    'db.internal'
    >>> host_of("host=db dbname=shop") is None
    True
    """
    try:
        return urlsplit(url).hostname
    except ValueError:  # a port that is not a number, brackets that do not close
        return None
