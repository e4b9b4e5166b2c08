"""`Client.get` gives objects that decode on their own, as `list` gives its items."""

from __future__ import annotations

from typing import Any

import pytest

from dractl import model
from dractl.kube import client


def _client(answer: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> client.Client:
    """A client whose every request answers a copy of `answer` (no API server)."""
    made = client.Client(None)  # type: ignore[arg-type]
    monkeypatch.setattr(made, "_request", lambda method, path, **_: dict(answer))
    return made


def test_get_adds_the_kind_a_server_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: an answer without apiVersion and kind gets the resource's, so the typed read decodes it."""
    bare = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }
    api = _client(bare, monkeypatch)
    raw = api.get(client.RESOURCE_CLAIMS, "c", namespace="ns")
    assert (raw["apiVersion"], raw["kind"]) == ("resource.k8s.io/v1", "ResourceClaim")
    claim = api.get_resource_claim("ns", "c")
    assert isinstance(claim, model.ResourceClaim) and claim.key == "ns/c"


def test_get_keeps_the_kind_the_server_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: the kind is only filled in when missing, never overwritten."""
    api = _client({"apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceClaim", "metadata": {}}, monkeypatch)
    raw = api.get(client.RESOURCE_CLAIMS, "c", namespace="ns")
    assert (raw["apiVersion"], raw["kind"]) == ("resource.k8s.io/v1beta2", "ResourceClaim")
