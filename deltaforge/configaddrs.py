"""Server addresses in a pipeline's config (DSNs, URIs, broker lists), checked when the config is
read: a port that is not a number from 1 to 65535, or an IPv6 host whose bracket does not close.

Those passed ``deltaforge validate`` (only the scheme was checked), and then ``validate`` itself
failed with a traceback (``ValueError: Port could not be cast to integer value``: a PostgreSQL
source's slot is keyed by its DSN's host and port), or ``serve`` did at the first connection. The
error names the field and what is wrong, never the value: a DSN holds a password.
"""

from __future__ import annotations

from urllib.parse import urlsplit

PORTS = "a number from 1 to 65535"


def address_problem(hosts: str) -> str | None:
    """What is wrong with ``host[:port]`` pieces, comma-separated (a URL's part after its ``@``,
    or a broker list), if anything.

    >>> address_problem("db:5432,db2")
    >>> address_problem("db:notaport")
    "port 'notaport' is not a number from 1 to 65535"
    >>> address_problem("[::1:5432")
    'an IPv6 host whose bracket does not close'
    """
    for piece in hosts.split(","):
        piece = piece.strip()
        try:
            port = urlsplit(f"//{piece}").port
        except ValueError:
            if piece.startswith("[") and "]" not in piece:
                return "an IPv6 host whose bracket does not close"
            return f"port {piece.rpartition(':')[2]!r} is not {PORTS}"
        if port == 0:
            return f"port 0 is not {PORTS}"
    return None


def url_problem(url: str) -> str | None:
    """What is wrong with the hosts and ports of a URL (``scheme://user:password@host:port/...``,
    the scheme and userinfo optional), if anything: see :func:`address_problem`."""
    rest = url.partition("://")[2] if "://" in url else url
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    return address_problem(netloc.rpartition("@")[2])
