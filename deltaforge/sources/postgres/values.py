"""PostgreSQL text-format values to Python values, by type OID."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any

import orjson

# pgoutput sends values as their output functions print them, which depends on the decoding
# session's settings: pin the ones this module parses, whatever the server or database default
# (the snapshot's connections too: its rows must read as the stream's do).
SESSION = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}

OWN_BOUNDS = {"statement_timeout": "0", "lock_timeout": "0"}
"""A role's or database's ``statement_timeout`` (common in production) cancelled the slot's
creation while it waited for a long transaction, a crash at each attempt until the pipeline
failed, and would cancel any chunk read or slot move longer than it; a ``lock_timeout`` a chunk
read waiting behind an ``ALTER``. deltaforge bounds its own questions (``query_timeout_s``; the
slot's long ones watched from another connection, ``watched.py``), so the source's own sessions
and the snapshot's turn the server's bounds off for themselves. (The stream's replication commands
are not subject to them: probed, a database's 200 ms ``statement_timeout`` left it streaming.)"""


def _bool(s: str) -> bool:
    return s == "t"


def _bytea(s: str) -> bytes:
    if s.startswith("\\x"):
        return bytes.fromhex(s[2:])
    return s.encode("latin-1")  # escape format; bytea_output=hex is the default


def _beyond_python(s: str) -> bool:
    """infinity, -infinity, BC dates and years past 9999 (PostgreSQL's go to 294276): no Python
    value holds them, so PostgreSQL's own text stays (it halted the reader, as unparsable)."""
    return s in ("infinity", "-infinity") or s.endswith(" BC") or s[4:5].isdigit()


def _timestamp(s: str) -> dt.datetime | str:
    # The decoding session runs with DateStyle ISO (decoder.py), so anything else is an error
    # that halts the reader, never a value silently passed on as text.
    return s if _beyond_python(s) else dt.datetime.fromisoformat(s)


def _timestamptz(s: str) -> dt.datetime | str:
    if _beyond_python(s):
        return s
    if len(s) > 3 and s[-3] in "+-" and s[-2:].isdigit():
        s = s + ":00"  # '+00' -> '+00:00'
    return _timestamp(s)


def _date(s: str) -> dt.date | str:
    return s if _beyond_python(s) else dt.date.fromisoformat(s)


def _float(s: str) -> float | str:
    """A real or double. NaN and the infinities stay PostgreSQL's text (``'NaN'``, ``'Infinity'``,
    ``'-Infinity'``): JSON has no number for them, and orjson writes them as null, which a
    consumer cannot tell from SQL NULL. A numeric's are text in JSON too (its Decimal is written
    as its text), and Debezium's JSON spells them the same."""
    value = float(s)
    return value if math.isfinite(value) else s


def _numeric(s: str) -> Decimal | str:
    try:
        return Decimal(s)
    except ArithmeticError:
        return s


# A number orjson may not read exactly: 16 or more digits (a decimal point among them), or a
# three-digit exponent (it may also match inside a string: the exact check then runs for nothing).
_LONG_NUMBER = re.compile(r"\d[\d.]{15}|[eE][+-]?\d{3}")


class _Inexact(Exception):
    pass


def _exact_int(text: str) -> int:
    value = int(text)
    if not -(2**63) <= value < 2**64:  # orjson reads a longer one as a float
        raise _Inexact
    return value


def _exact_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or Decimal(repr(value)) != Decimal(text):
        raise _Inexact
    return value


def _json(s: str) -> Any:
    """A json or jsonb document, read. One whose every number a double (or a 64-bit integer)
    holds exactly, that is; PostgreSQL keeps numbers exactly (jsonb as numeric) and a json
    value may hold a lone UTF-16 surrogate, and orjson rounds the former and refuses the latter
    and numbers past a double's range (which halted the reader). Such a document stays
    PostgreSQL's text, as Debezium delivers every document."""
    try:
        doc = orjson.loads(s)
    except orjson.JSONDecodeError:
        return s
    if _LONG_NUMBER.search(s):
        try:
            json.loads(s, parse_int=_exact_int, parse_float=_exact_float)
        except (_Inexact, ValueError):
            return s
    return doc


SCALARS: dict[int, Callable[[str], Any]] = {
    16: _bool,
    17: _bytea,
    20: int,
    21: int,
    23: int,
    26: int,
    700: _float,
    701: _float,
    1700: _numeric,
    114: _json,
    3802: _json,
    1082: _date,
    1114: _timestamp,
    1184: _timestamptz,
}
# array type OID -> element type OID
ARRAYS: dict[int, int] = {
    1000: 16, 1001: 17, 1005: 21, 1007: 23, 1016: 20, 1021: 700, 1022: 701, 1231: 1700,
    1009: 25, 1015: 1043, 1014: 1042, 2951: 2950, 199: 114, 3807: 3802, 1182: 1082, 1115: 1114, 1185: 1184,
}  # fmt: skip


def parse_array(s: str, element: Callable[[str], Any]) -> list[Any]:
    """A one- or more-dimensional array literal such as ``{1,2,NULL}`` or ``{{"a b",c}}``."""
    pos = 0
    if s.startswith("["):  # explicit bounds: [1:3]={...}
        pos = s.index("=") + 1

    def parse(i: int) -> tuple[list[Any], int]:
        assert s[i] == "{"
        i += 1
        out: list[Any] = []
        while i < len(s):
            c = s[i]
            if c == "}":
                return out, i + 1
            if c == ",":
                i += 1
                continue
            if c == "{":
                sub, i = parse(i)
                out.append(sub)
                continue
            if c == '"':
                i += 1
                buf = []
                while s[i] != '"':
                    if s[i] == "\\":
                        i += 1
                    buf.append(s[i])
                    i += 1
                out.append(element("".join(buf)))
                i += 1
                continue
            j = i
            while s[j] not in ",}":
                j += 1
            tok = s[i:j]
            out.append(None if tok == "NULL" else element(tok))
            i = j
        raise ValueError(f"unterminated array literal {s!r}")

    return parse(pos)[0]


TYPES = (
    "SELECT t.oid::bigint, t.typtype = 'd', t.typbasetype::bigint, t.typelem::bigint, "
    "COALESCE(e.typarray = t.oid AND e.typdelim = ',', false) "
    "FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem WHERE t.oid = ANY(%s::bigint[]::oid[])"
)
"""What :class:`Types` learns of each type OID asked for (``%s``: a list of OIDs; an OID is unsigned, past ``int``'s range): whether it is
a domain and its base type; whether it is an array whose elements a ``,`` separates, and their
type (``box[]``'s elements are separated by ``;``; ``point``, ``name`` and the vectors have an
element type and are not arrays)."""


class Types:
    """The type OIDs :data:`SCALARS` and :data:`ARRAYS` do not name, as the catalog says them.

    pgoutput and a snapshot's columns name a column's type by its OID, and a domain's is its
    own, as an array of an enum's or a composite's is: by OID alone, a domain over ``numeric``
    read as text (``'3.50'``) and an ``enum[]`` as its literal (``'{sad,happy}'``). Debezium
    types a domain by its base type and any array as an array. The caller looks up what
    :meth:`missing` names (with :data:`TYPES`) and hands the rows to :meth:`learn`, until
    nothing is missing; :meth:`converter` then reads a domain as its base type and any array as
    a list. A type's base and element type never change (``ALTER DOMAIN`` cannot change a base),
    so what is learnt is kept.
    """

    def __init__(self) -> None:
        self.known: dict[int, tuple[int, int]] = {}
        """OID -> (base type if a domain, else 0; element type if an array, else 0)."""

    def missing(self, oids: Iterable[int]) -> list[int]:
        """The OIDs (of ``oids``, and of the bases and elements they lead to) still to look up."""
        need: set[int] = set()
        todo = list(oids)
        while todo:
            oid = todo.pop()
            if oid in SCALARS or oid in ARRAYS or oid in need:
                continue
            found = self.known.get(oid)
            if found is None:
                need.add(oid)
            else:
                todo.extend(t for t in found if t)
        return sorted(need)

    def learn(self, asked: Iterable[int], rows: Iterable[Sequence[Any]]) -> None:
        """What :data:`TYPES` answered for ``asked``; an OID it did not answer for (a type dropped
        since) is read as text."""
        for oid in asked:
            self.known[oid] = (0, 0)
        for oid, domain, base, element, is_array in rows:
            self.known[int(oid)] = (int(base) if domain else 0, int(element) if is_array else 0)

    def base(self, type_oid: int) -> int:
        """The type a domain is of, through domains over domains; any other type is its own."""
        while base := self.known.get(type_oid, (0, 0))[0]:
            type_oid = base
        return type_oid

    def converter(self, type_oid: int) -> Callable[[str], Any]:
        """The function turning a text value of this type into a Python value (str by default)."""
        scalar = SCALARS.get(type_oid)
        if scalar is not None:
            return scalar
        base, element_oid = self.known.get(type_oid, (0, 0))
        if base:
            return self.converter(base)
        element_oid = ARRAYS.get(type_oid, element_oid)
        if element_oid:
            element = self.converter(element_oid)
            return lambda s: parse_array(s, element)
        return str


def converter(type_oid: int) -> Callable[[str], Any]:
    """The function turning a text value of a built-in type into a Python value (str by default)."""
    return Types().converter(type_oid)
