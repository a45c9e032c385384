"""PostgreSQL source: ``source`` (the reader), ``decoder`` (the streaming, decoding child
process), ``replication`` (the streaming protocol), ``pgoutput`` (the messages), ``values`` (text to Python values), ``config`` and ``position``.

Kept empty of imports so the decoder child process starts without the reader's dependencies.
"""
