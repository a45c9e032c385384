"""pymysql's connection, with its opportunistic-TLS context built once per process.

With no TLS settings, pymysql connects in MySQL's PREFERRED mode: TLS when the server offers
it, the certificate not verified. For that it builds ``ssl.create_default_context()`` on every
connection, which loads the system CA bundle — about 30 ms of CPU per connection, for
certificates an unverified context never looks at. A start opens three connections (checks,
the decoder's control and stream connections), each reconnect after an outage opens them
again. This connection keeps the PREFERRED behaviour and shares one context that skips the
bundle; any explicit TLS setting goes to pymysql unchanged.

Example::

    >>> a = Connection(host="127.0.0.1", defer_connect=True)
    >>> b = Connection(host="127.0.0.1", defer_connect=True)
    >>> a.ctx is b.ctx, a.ctx.verify_mode == ssl.CERT_NONE, a._ssl_required
    (True, True, False)
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING, Any

import pymysql


@functools.cache
def preferred_tls() -> ssl.SSLContext:
    """The context pymysql builds for PREFERRED mode, minus the CA bundle it would not use."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    # as pymysql: MySQL's self-signed certificates fail Python 3.13's strict X.509 checks
    ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return ctx


if TYPE_CHECKING:  # generic in the stubs only
    _Base = pymysql.connections.Connection[Any]
else:
    _Base = pymysql.connections.Connection


class Connection(_Base):
    """A pymysql connection sharing :func:`preferred_tls` when no TLS setting is given."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if isinstance(sslp, dict) and not sslp:  # PREFERRED mode: nothing configured
            return preferred_tls()
        return super()._create_ssl_ctx(sslp)  # type: ignore[misc, no-any-return]
