"""Turso source: ``source`` (reads ``turso_cdc``), ``record`` (SQLite record decoding),
``workload`` (the demo writer), ``config`` and ``position``."""
