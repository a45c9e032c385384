"""MySQL/MariaDB source: ``source`` (the reader), ``decoder`` (the binlog child process),
``checks`` (server preconditions and position checks), ``config`` and ``position``.

Kept empty of imports so the decoder child process starts without the reader's dependencies.
"""
