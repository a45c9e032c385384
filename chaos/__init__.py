"""Chaos runs for deltaforge: faults injected through Toxiproxy-style proxies, exact assertions.

``chaos.proxy`` is a Toxiproxy-compatible server (``python -m chaos proxy``), so any
Toxiproxy client can drive it; when a real ``toxiproxy-server`` is on PATH the
scenarios use that instead.
"""
