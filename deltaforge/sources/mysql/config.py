"""``spec.source.config`` of a MySQL/MariaDB source."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from deltaforge.configmodel import (
    Hint,
    PositiveInt,
    ServerSourceSettings,
    Text,
    fail,
    matching,
    server_addresses,
)


def _db_tables(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) and "." in t for t in value):
        fail("expected a list of db.table names (db.* allowed)")
    return list(value)


MySQLDsn = Annotated[
    Text,
    matching(r"^(mysql|mariadb)://[^/]+", "expected mysql://user:password@host:port/db"),
    server_addresses("expected mysql://user:password@host:port/db"),
]
DbTables = Annotated[list[str], BeforeValidator(_db_tables), Hint("a list of db.table names")]


class MySQLSourceConfig(ServerSourceSettings):
    """A MySQL 8 or MariaDB server's binlog, read as a replica."""

    dsn: MySQLDsn = Field(description="mysql://user:password@host:port/db (${VAR} for the password).")
    tables: DbTables = Field(
        default_factory=list, description="db.table names to capture, db.* allowed (default: all)."
    )
    server_id: PositiveInt | None = Field(
        None, description="Replica server id (default: derived from the source id)."
    )
    read_chunk: PositiveInt = Field(2000, description="Rows handed over per read.")
    foreign_key_cascades: Literal["refuse", "warn"] = Field(
        "refuse",
        description="A captured table that foreign keys change by ON DELETE/UPDATE CASCADE, SET NULL or "
        "SET DEFAULT: InnoDB makes those changes without writing them to the binlog (MariaDB; MySQL "
        "before 9.6), so they are never delivered. refuse: do not start, naming the keys; warn: start, "
        "and name them in the log at every start.",
    )
    resume_by: Literal["auto", "file"] = Field(
        "auto",
        description="auto: GTID on MariaDB, binlog file and position on MySQL; "
        "file: binlog file and position on both.",
    )
