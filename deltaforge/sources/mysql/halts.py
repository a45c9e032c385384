"""Why the binlog decoder child stops: what it met that it must not deliver or skip. Each message
says where in the binlog (``file:pos``) and what to do; ``decoder.main`` reports each kind to
``serve`` (misconfigured, position lost, a source error)."""

from __future__ import annotations

# Events python-mysql-replication cannot decode and that may carry rows: MariaDB's compressed
# query and row events (log_bin_compress=ON) and MySQL's transaction payload
# (binlog_transaction_compression=ON). Skipping them would skip rows: the reader halts instead.
UNDECODABLE = {
    165: "a MariaDB compressed query event",
    166: "a MariaDB compressed row event",
    167: "a MariaDB compressed row event",
    168: "a MariaDB compressed row event",
    169: "a MariaDB compressed row event",
    170: "a MariaDB compressed row event",
    171: "a MariaDB compressed row event",
    40: "a MySQL compressed transaction payload",
}
PARTIAL_JSON = (
    "a MySQL partial JSON update (binlog_row_value_options=PARTIAL_JSON, set for the session that wrote "
    "it): it carries only the changed part of a document, so its row cannot be delivered whole"
)


class XaUnknown(Exception):
    """An XA COMMIT whose prepared rows were never read: the position cannot serve them."""


class Undecodable(Exception):
    """The binlog holds an event whose rows cannot be decoded here; the message says where and why."""


class CorruptEvent(Exception):
    """An event whose bytes do not match its CRC32 checksum: damaged on the server's disk or on the
    way. Reading again from the checkpoint cures the second, not the first: the source restarts a
    few times, then the pipeline halts with this message, instead of delivering damaged rows."""
