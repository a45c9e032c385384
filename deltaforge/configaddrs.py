"""Server addresses in a pipeline's config (DSNs, URIs, broker lists), checked when the config is
read: a port that is not a number from 1 to 65535, an IPv6 host whose bracket does not close, a
password holding what a URL must percent-encode.

Those passed ``deltaforge validate`` (only the scheme was checked), and then ``validate`` itself
failed with a traceback (``ValueError: Port could not be cast to integer value``: a PostgreSQL
source's slot is keyed by its DSN's host and port), or ``serve`` did at the first connection: a
password ``pa/ss`` written as it is made asyncpg raise ``invalid literal for int() with base 10:
'pa'``, the password's start in the pipeline's error and log. The error names the field and what
is wrong, never the value.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

PORTS = "a number from 1 to 65535"


def address_problem(hosts: str) -> str | None:
    """What is wrong with ``host[:port]`` pieces, comma-separated (a URL's part after its ``@``,
    or a broker list), if anything. The port is not echoed: in a DSN whose password holds a
    character a URL must encode, what looks like the port may be the password's start.

    >>> address_problem("db:5432,db2")
    >>> address_problem("db:notaport")
    'the port is not a number from 1 to 65535'
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
            return f"the port is not {PORTS}"
        if port == 0:
            return f"the port is not {PORTS}"
    return None


def url_problem(url: str, first_at: bool = False) -> str | None:
    """What is wrong with a URL's user, password, hosts and ports (``scheme://user:password@
    host:port/...``, the scheme and userinfo optional), if anything; ``first_at``: its driver
    ends the user and password at the first ``@`` (asyncpg), not the last.

    >>> url_problem("postgresql://cdc:pa/ss@db:5432/shop")
    "the user or password holds a '/', '?' or '#': write it percent-encoded (%2F, %3F, %23)"
    >>> url_problem("postgresql://cdc:p@ss@db/shop", first_at=True)
    "the password holds an '@': write it %40 (the driver ends the password at the first '@')"
    >>> url_problem("mysql://cdc:p@ss@db:3306/shop")
    >>> url_problem("postgresql://db/shop?user=cdc@eu-server&sslmode=require")
    """
    rest = url.partition("://")[2] if "://" in url else url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in rest and "@" not in authority and not _in_query(rest[len(authority) :]):
        # drivers would take what follows the '/' for the host
        return "the user or password holds a '/', '?' or '#': write it percent-encoded (%2F, %3F, %23)"
    userinfo, _, hosts = authority.rpartition("@")
    if first_at and "@" in userinfo:
        return "the password holds an '@': write it %40 (the driver ends the password at the first '@')"
    return address_problem(hosts)


def _in_query(tail: str) -> bool:
    """Whether the first '@' of ``tail`` (what follows a URL's authority) is in its query string,
    a parameter's value (``?user=cdc@eu-server``: a user name of Azure's single server), not in
    a password whose '/' or '?' ended the authority early (``pa/ss@db``, ``pa?ss@db``): a
    password holding both a '?' and a '=' before its '@' is taken for a query."""
    before = tail.partition("@")[0]
    query = before.partition("?")
    return bool(query[1]) and "=" in query[2]
