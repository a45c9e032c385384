"""A Toxiproxy-compatible proxy server on asyncio: ``toxics`` (what each toxic does),
``link`` (one proxied connection), ``proxy`` (a named proxy), ``api`` (Toxiproxy's HTTP API)."""
