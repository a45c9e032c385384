"""PostgreSQL source: ``source`` (the reader), ``decoder`` (peek + pgoutput child process),
``pgoutput`` (the protocol), ``values`` (text to Python values), ``config`` and ``position``.

Kept empty of imports so the decoder child process starts without the reader's dependencies.
"""
