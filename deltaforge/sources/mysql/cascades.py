"""MySQL/MariaDB foreign keys whose referential actions change captured tables.

InnoDB makes ``ON DELETE``/``ON UPDATE`` ``CASCADE``, ``SET NULL`` and ``SET DEFAULT`` changes
itself, without writing them to the binlog (MariaDB; MySQL before 9.6, or with
``innodb_native_foreign_keys=ON``): a parent's delete is logged, its children's are not. Runs in
a worker thread (pymysql is blocking).

    >>> referential_actions("  CONSTRAINT `fk` FOREIGN KEY (`p`) REFERENCES `p` (`id`) ON DELETE CASCADE")
    {'fk': ['ON DELETE CASCADE']}
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pymysql
import structlog

from deltaforge.sources.mysql.names import matches, quote_ident

_FOREIGN_KEYS = (
    "SELECT DISTINCT TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME "
    "FROM information_schema.KEY_COLUMN_USAGE WHERE REFERENCED_TABLE_NAME IS NOT NULL "
    "ORDER BY TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME"
)
_NO_SUCH_TABLE = 1146
_IDENT = re.compile(r"`(?:[^`]|``)*`")
_ACTION = re.compile(r" ON (DELETE|UPDATE) (CASCADE|SET NULL|SET DEFAULT)")


def referential_actions(create_table: str) -> dict[str, list[str]]:
    """The referential actions that change rows (``ON DELETE CASCADE``, ...) of each foreign key
    in a ``SHOW CREATE TABLE`` text, by constraint name. Names are read with their quoting, and
    matched for actions with every identifier blanked, so no name can look like an action."""
    out = {}
    for line in create_table.splitlines():
        line = line.strip()
        if line.startswith("CONSTRAINT `") and " FOREIGN KEY " in line:
            name = _IDENT.match(line, len("CONSTRAINT "))
            if name is not None:
                bare = _IDENT.sub("``", line)
                out[name.group()[1:-1].replace("``", "`")] = [
                    f"ON {op} {rule}" for op, rule in _ACTION.findall(bare)
                ]
    return out


def cascaded(conn: Any, captured: Sequence[tuple[str, ...]], fold: bool, mode: str) -> list[str]:
    """Captured tables that foreign keys change by a referential action: InnoDB makes those
    changes itself and the binlog carries only the statement's own rows (a parent's delete, not
    its children's), so they would never be delivered. Refused, or (``warn``) logged."""
    # information_schema.REFERENTIAL_CONSTRAINTS would say the rules, but MariaDB shows it only
    # to users with more than SELECT on the table: the keys are found in KEY_COLUMN_USAGE, their
    # rules in SHOW CREATE TABLE (the server's own rendering), which SELECT is enough for.
    with conn.cursor() as cur:
        cur.execute(_FOREIGN_KEYS)
        found = [r for r in cur.fetchall() if matches(captured, str(r[0]), str(r[1]), fold)]
        shown: dict[tuple[str, str], dict[str, list[str]]] = {}
        for db, table, *_ in found:
            if (db, table) not in shown:
                try:
                    cur.execute(f"SHOW CREATE TABLE {quote_ident(db)}.{quote_ident(table)}")
                except pymysql.err.ProgrammingError as exc:  # dropped since: nothing of it to capture
                    if exc.args[0] != _NO_SUCH_TABLE:
                        raise
                    shown[db, table] = {}
                else:
                    shown[db, table] = referential_actions(str(cur.fetchone()[1]))
    keys = []
    for db, table, name, parent_db, parent in found:
        actions = shown[db, table].get(str(name))
        if actions:
            keys.append(f"{db}.{table}: {name} ({', '.join(actions)} from {parent_db}.{parent})")
    if not keys:
        return []
    if mode == "warn":
        structlog.get_logger().warning(
            "foreign_key_cascades_not_logged", actor="MySQLSource", keys=keys,
            reason="InnoDB makes these foreign keys' changes without writing them to the binlog, so they are never delivered",
        )  # fmt: skip
        return []
    return [
        f"{key.replace(': ', ' is changed by foreign key ', 1)}, which InnoDB makes without writing it to the "
        "binlog, so those changes would never be delivered"
        for key in keys
    ] + [
        "drop the referential actions (ON DELETE RESTRICT, and change the child rows in the same transaction), "
        "leave those tables out of tables, or set foreign_key_cascades: warn to capture the rest knowing "
        "those changes are missing"
    ]
