"""``deltaforge pipelines …``: the lifecycle endpoints from the command line, against a running
``serve`` (its ``--api-addr``), with the token from ``DELTAFORGE_API_TOKEN`` or ``--token-file``."""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import quote

from deltaforge import argfiles

VERBS = ("list", "get", "create", "patch", "pause", "resume", "stop", "delete")


def request(api: str, token: str | None, verb: str, name: str | None, file: str | None,
            delete_checkpoints: bool = False) -> tuple[int, Any]:  # fmt: skip
    """The HTTP call for ``verb``: (status, JSON body)."""
    import httpx  # here, not at the top: ``serve`` imports this module and needs no HTTP client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body: bytes | None = None
    if file is not None:
        text = argfiles.read(file, "--file")
        body = text.encode()
        headers["Content-Type"] = "application/yaml"  # YAML is a superset of JSON
    name = quote(name, safe="") if name is not None else None  # a '#', '?' or space is the name's
    method, path = {
        "list": ("GET", "/pipelines"),
        "get": ("GET", f"/pipelines/{name}"),
        "create": ("POST", "/pipelines"),
        "patch": ("PATCH", f"/pipelines/{name}"),
        "pause": ("POST", f"/pipelines/{name}/pause"),
        "resume": ("POST", f"/pipelines/{name}/resume"),
        "stop": ("POST", f"/pipelines/{name}/stop"),
        "delete": ("DELETE", f"/pipelines/{name}" + ("?checkpoints=delete" if delete_checkpoints else "")),
    }[verb]
    if verb == "patch" and body is not None:
        import yaml

        body = json.dumps(yaml.safe_load(body)).encode()  # a merge patch is JSON
        headers["Content-Type"] = "application/merge-patch+json"
    resp = httpx.request(method, api.rstrip("/") + path, content=body, headers=headers, timeout=120)
    return resp.status_code, resp.json()


def run(api: str, token: str | None, verb: str, name: str | None, file: str | None,
        delete_checkpoints: bool = False) -> int:  # fmt: skip
    if verb in ("get", "patch", "pause", "resume", "stop", "delete") and not name:
        print(f"pipelines {verb} needs a pipeline name", file=sys.stderr)
        return 2
    if verb in ("create", "patch") and not file:
        print(f"pipelines {verb} needs a document: a file, or - for stdin", file=sys.stderr)
        return 2
    import httpx

    try:
        status, body = request(api, token, verb, name, file, delete_checkpoints)
    except httpx.HTTPError as exc:
        print(f"cannot reach the deltaforge API at {api}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(body, indent=2))
    return 0 if status < 300 else 1


def snapshot(api: str, token: str | None, pipeline: str, tables: list[str]) -> int:
    """``deltaforge snapshot PIPELINE TABLE…``: POST /pipelines/{name}/snapshots."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.post(f"{api.rstrip('/')}/pipelines/{quote(pipeline, safe='')}/snapshots", json={"tables": tables},
                          headers=headers, timeout=120)  # fmt: skip
    except httpx.HTTPError as exc:
        print(f"cannot reach the deltaforge API at {api}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(resp.json(), indent=2))
    return 0 if resp.status_code < 300 else 1
