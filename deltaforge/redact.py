"""Credentials masked out of any text: what logs and API responses pass through.

Example::

    >>> redact("connect to mysql://cdc:s3cret@db:3306/shop failed")
    'connect to mysql://cdc:***@db:3306/shop failed'
    >>> redact("host=db password=s3cret dbname=app")
    'host=db password=*** dbname=app'
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@\"']*):([^@\s\"'/]+)@")
_KEY_PASSWORD = re.compile(r"(?i)\b(password|passwd|pwd)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"'}]+)")


def redact(text: str) -> str:
    """``text`` with every password it carries replaced by ``***``."""
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1:***@", text)
    if "pass" in text.lower() or "pwd" in text.lower():
        text = _KEY_PASSWORD.sub(r"\1\2***", text)
    return text
