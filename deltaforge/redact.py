"""Credentials masked out of any text: what logs and API responses pass through.

Example::

    >>> redact("connect to mysql://cdc:s3cret@db:3306/shop failed")
    'connect to mysql://cdc:***@db:3306/shop failed'
    >>> redact("mysql://cdc:p@ss/w@db:3306/shop and nats://t0ken@nats:4222")
    'mysql://cdc:***@db:3306/shop and nats://***@nats:4222'
    >>> redact("host=db password=s3cret dbname=app")
    'host=db password=*** dbname=app'
    >>> redact('{"producer": {"sasl.password": "s3cret", "ssl.key.password": 1234}}')
    '{"producer": {"sasl.password": "***", "ssl.key.password": "***"}}'
"""

from __future__ import annotations

import re

# The password runs to the userinfo's last ``@`` (as drivers read it: ``p@ss`` and ``pa/ss``
# typed as they are still connect), within one URL of a list (``nats://a,nats://b``).
_URL_PASSWORD = re.compile(
    r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@\"',]*):((?:(?!,[A-Za-z][A-Za-z0-9+.-]*://)[^\s\"'])+)@"
)
_NATS_TOKEN = re.compile(r"((?:nats|tls|wss?)://)([^/\s:@\"',]+)@")
"""NATS takes a token as the URL's user (``nats://s3cr3t@host:4222``)."""
# A key that names a secret, in the forms text carries one: ``key=value`` (a libpq DSN), JSON's
# ``"key": value`` (also inside a JSON string, its quotes escaped, at any depth) and a Python
# dict's ``'key': value``. Not an unquoted ``key: ...``: that is how errors name a field
# (``spec.sinks[0].config.password: unknown field``). librdkafka's settings are the reason for
# dotted names and for ``secret`` (``sasl.password``, ``sasl.oauthbearer.client.secret``).
_SECRET_NAME = r"[\w.-]*(?:password|passwd|pwd|secret)"
_SECRET_KEY = re.compile(rf"""(?ix) (?P<q>\\*["'])? (?P<key>{_SECRET_NAME}) (?(q)(?P=q)\s*[=:]|\s*=) \s* """)
_SECRET_NAME_RE = re.compile(_SECRET_NAME, re.IGNORECASE)
_QUOTE = re.compile(r"""\\*["']""")
_BARE = re.compile(r"""[^\s,;&"'}\]\\]+""")
_HINTS = ("pass", "pwd", "secret")


def names_secret(name: str) -> bool:
    """Whether a setting called ``name`` holds a secret (``password``, ``sasl.password``)."""
    return _SECRET_NAME_RE.fullmatch(name) is not None


def redact(text: str) -> str:
    """``text`` with every password it carries replaced by ``***``."""
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1:***@", text)
        text = _NATS_TOKEN.sub(r"\1***@", text)
    lower = text.lower()
    if any(hint in lower for hint in _HINTS):
        text = _mask_secret_values(text)
    return text


def _mask_secret_values(text: str) -> str:
    out: list[str] = []
    pos = 0
    while (m := _SECRET_KEY.search(text, pos)) is not None:
        start = m.end()
        end, quote = _value(text, start, m["q"] or "")
        if end == start:  # no value after all (``password:`` at the end of a sentence)
            out.append(text[pos:start])
        else:
            # A quoted key gets its value quoted the same way: JSON stays JSON, whatever it held.
            out.append(f"{text[pos:start]}{quote}***{quote}")
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _value(text: str, start: int, key_quote: str) -> tuple[int, str]:
    """Where the value starting at ``start`` ends, and the quote to show the mask in."""
    opening = _QUOTE.match(text, start)
    if opening is None:
        bare = _BARE.match(text, start)
        return (bare.end() if bare else start), key_quote
    quote = opening.group()
    # A string ``depth`` levels deep in JSON-in-JSON opens and closes with a quote after n =
    # 2**depth - 1 backslashes; inside it, an escaped quote or backslash adds runs of 2n + 2
    # more. So a quote closes it when the backslashes before it number n modulo 2n + 2.
    n, char = len(quote) - 1, quote[-1]
    i = opening.end()
    while (j := text.find(char, i)) != -1:
        run = j - len(text[i:j].rstrip("\\")) - i
        if run % (2 * n + 2) == n:
            return j + 1, quote
        i = j + 1
    return len(text), quote  # never closed: mask to the end rather than show any of it
