"""Why a connection could not be made, in its error's own words and with the host a name lookup
failed for.

A sink said ``cannot connect: gaierror`` (PostgreSQL) or ``cannot connect: NoServersError``
(NATS) and nothing more, and a PostgreSQL source ``gaierror: [Errno -2] Name or service not
known``: the words of a failed lookup name no host, so a misspelt one in a DSN could only be
guessed at. What servers and drivers say goes through :func:`deltaforge.redact.redact` (an
error may quote a DSN).
"""

from __future__ import annotations

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
    """
    words = redact(str(exc))
    said = f"{type(exc).__name__}: {words}" if words else type(exc).__name__
    if host and isinstance(exc, socket.gaierror):
        said += f" (looking up {host!r})"
    return said


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
