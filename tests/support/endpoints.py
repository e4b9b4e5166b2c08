"""GET of the HTTP endpoints dractl's processes serve (/healthz, /readyz, /metrics), for the tests."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(port: int | None, path: str, *, host: str = "127.0.0.1") -> tuple[int, str]:
    """The status and text of `GET http://<host>:<port><path>`, an error status included (a 503's reasons)."""
    assert port is not None, f"no port to GET {path} from: the endpoint is off"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
