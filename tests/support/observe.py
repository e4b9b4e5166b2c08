"""What the tests read from a running dractl process: its HTTP endpoints (/healthz, /readyz, /metrics) and the JSON
objects of its log."""

from __future__ import annotations

import contextlib
import json
import pathlib
import urllib.error
import urllib.request
from typing import Any


def get(port: int | None, path: str, *, host: str = "127.0.0.1") -> tuple[int, str]:
    """The status and text of `GET http://<host>:<port><path>`, an error status included (a 503's reasons)."""
    assert port is not None, f"no port to GET {path} from: the endpoint is off"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def log_entries(log: pathlib.Path) -> list[dict[str, Any]]:
    """The JSON objects of a process's log (`--log-format json`), in order; other lines (a traceback) are skipped."""
    entries = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(entry)
    return entries
