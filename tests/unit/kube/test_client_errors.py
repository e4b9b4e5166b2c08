"""`Client(on_error=...)` hears of each call that fails, once, with its verb and resource (the controller's
api_errors metric is built on it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.scripted_client import Response, scripted

from dractl.kube import client

Heard = list[tuple[str, str, int]]


def _client(
    answers: list[Response | client.ApiError], monkeypatch: pytest.MonkeyPatch, *, attempts: int = 1
) -> tuple[client.Client, Heard, list[str]]:
    """A client (no API server) whose requests take `answers` in order, what its `on_error` heard as (verb,
    plural, status), and the methods of the requests sent."""
    heard: Heard = []
    made, sent = scripted(
        answers,
        monkeypatch,
        attempts=attempts,
        on_error=lambda verb, resource, error: heard.append((verb, resource.plural, error.status)),
    )
    return made, heard, sent


_CLAIM = {"metadata": {"name": "c", "namespace": "ns", "resourceVersion": "7"}}

CALLS: dict[str, tuple[str, Callable[[client.Client], object]]] = {
    "get": ("get", lambda api: api.get(client.PODS, "p", namespace="ns")),
    "list": ("list", lambda api: api.list(client.PODS)),
    "watch": ("watch", lambda api: api.watch(client.PODS, resource_version="1")),
    "create": ("create", lambda api: api.create(client.PODS, _CLAIM)),
    "update": ("update", lambda api: api.update(client.PODS, _CLAIM)),
    "update_status": ("update", lambda api: api.update_status(client.PODS, _CLAIM)),
    "patch": ("patch", lambda api: api.patch(client.PODS, "p", {"status": {}}, namespace="ns")),
    "delete": ("delete", lambda api: api.delete(client.PODS, "p", namespace="ns")),
    "get_resource_claim": ("get", lambda api: api.get_resource_claim("ns", "c")),
}


@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS))
def test_a_failed_call_is_heard_once_with_its_verb(call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: every request method (and the ones built on them: update_status is an update, the typed get a get)
    tells on_error its verb, resource and status once, and the error still reaches the caller."""
    verb, send = CALLS[call]
    api, heard, _ = _client([client.error_from_status(403, b"")], monkeypatch)
    with pytest.raises(client.ApiError):
        send(api)
    plural = "resourceclaims" if call == "get_resource_claim" else "pods"
    assert heard == [(verb, plural, 403)]


def test_retries_are_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a call that fails after its retries is heard once, not once per attempt."""
    unavailable = [client.error_from_status(503, b"") for _ in range(3)]
    api, heard, sent = _client(list(unavailable), monkeypatch, attempts=3)
    with pytest.raises(client.Transient):
        api.get(client.PODS, "p", namespace="ns")
    assert sent == ["GET"] * 3
    assert heard == [("get", "pods", 503)]


def test_a_list_failing_on_a_later_page_is_heard_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a paged list is one call: a 410 on its second page is heard once, as `list`."""
    first = Response({"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "next"}})
    api, heard, sent = _client([first, client.error_from_status(410, b"")], monkeypatch)
    with pytest.raises(client.Gone):
        api.list(client.PODS)
    assert sent == ["GET", "GET"]
    assert heard == [("list", "pods", 410)]


def test_calls_that_succeed_or_fail_before_sending_are_not_heard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: on_error hears only of ApiErrors: not of answers, nor of an update refused before it is sent."""
    api, heard, sent = _client([Response({"metadata": {"name": "p"}})], monkeypatch)
    assert api.get(client.PODS, "p", namespace="ns")["kind"] == "Pod"
    with pytest.raises(ValueError, match="resourceVersion is required"):
        api.update(client.PODS, {"metadata": {"name": "p", "namespace": "ns"}})
    assert sent == ["GET"]
    assert heard == []


def test_a_watch_breaking_while_it_streams_is_not_heard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: errors raised while a watch streams are the reader's (the informer's), not a failed call."""
    api, heard, _ = _client([Response(broken=True)], monkeypatch)
    stream = api.watch(client.PODS, resource_version="1")
    with pytest.raises(client.Transient, match="watch connection broke"):
        list(stream)
    assert heard == []


def test_with_kind_fills_in_only_what_is_missing() -> None:
    """Guards: Resource.with_kind adds apiVersion and kind to an object without them and keeps the ones it has."""
    bare: dict[str, Any] = {"metadata": {"name": "c"}}
    assert client.RESOURCE_CLAIMS.with_kind(bare) is bare
    assert (bare["apiVersion"], bare["kind"]) == ("resource.k8s.io/v1", "ResourceClaim")
    older = client.RESOURCE_CLAIMS.with_kind({"apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceClaim"})
    assert older["apiVersion"] == "resource.k8s.io/v1beta2"
