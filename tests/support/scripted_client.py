"""A kube client with no API server behind it: each request it sends takes the next scripted answer.

For the tests of what `dractl.kube.client.Client` does with answers (retries, waits, the `on_error` hook): the
client's transport (`Client._send`, one request) is replaced, so everything above it runs as it does against a
server. An answer is a `Response` (2xx) or an `ApiError` the request raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3.exceptions

from dractl.kube import client


class Response:
    """A 2xx answer carrying `document`, or a stream that breaks when read (for watches)."""

    def __init__(self, document: dict[str, Any] | None = None, *, broken: bool = False) -> None:
        self.data = json.dumps(document or {}).encode()
        self.broken = broken

    def read(self) -> bytes:
        return self.data

    def stream(self, amount: int) -> Iterator[bytes]:
        if self.broken:
            raise urllib3.exceptions.ProtocolError("connection reset")
        yield self.data

    def release_conn(self) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def close(self) -> None:
        return None


def scripted(
    answers: list[Response | client.ApiError], monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[client.Client, list[str]]:
    """A `Client(None, **options)` whose requests take `answers` in order, and the methods of the requests it sent
    (one per attempt)."""
    sent: list[str] = []
    made = client.Client(None, **options)  # type: ignore[arg-type]

    def send(method: str, path: str, **_: Any) -> Response:
        sent.append(method)
        answer = answers.pop(0)
        if isinstance(answer, client.ApiError):
            raise answer
        return answer

    monkeypatch.setattr(made, "_send", send)
    return made, sent
