"""The kube client's pure parts: URL paths, the mapping of API answers to errors, and decoding one object at a time."""

from __future__ import annotations

import json
import logging

import pytest

from dractl import model
from dractl.kube import client


@pytest.mark.parametrize(
    ("resource", "kwargs", "path"),
    [
        pytest.param(
            client.RESOURCE_CLAIMS,
            {"namespace": "ns", "name": "c"},
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c",
            id="namespaced-object",
        ),
        pytest.param(
            client.RESOURCE_CLAIMS,
            {"namespace": "ns", "name": "c", "subresource": "status"},
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
            id="status",
        ),
        pytest.param(client.RESOURCE_CLAIMS, {}, "/apis/resource.k8s.io/v1/resourceclaims", id="all-namespaces"),
        pytest.param(
            client.RESOURCE_SLICES, {"name": "s"}, "/apis/resource.k8s.io/v1/resourceslices/s", id="cluster-scoped"
        ),
        pytest.param(client.PODS, {"namespace": "ns"}, "/api/v1/namespaces/ns/pods", id="core"),
        pytest.param(
            client.LEASES,
            {"namespace": "kube-system", "name": "l"},
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
            id="lease",
        ),
        pytest.param(client.NODES, {"namespace": "ignored", "name": "n"}, "/api/v1/nodes/n", id="namespace-ignored"),
    ],
)
def test_resource_paths(resource: client.Resource, kwargs: dict[str, str], path: str) -> None:
    """Guards: URL paths for core and grouped, namespaced and cluster-scoped resources and subresources."""
    assert resource.path(**kwargs) == path


def _status(code: int, reason: str, message: str = "m") -> bytes:
    return json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message}
    ).encode()


@pytest.mark.parametrize(
    ("status", "reason", "kind"),
    [
        pytest.param(404, "NotFound", client.NotFound, id="404"),
        pytest.param(409, "Conflict", client.Conflict, id="409-conflict"),
        pytest.param(409, "AlreadyExists", client.AlreadyExists, id="409-already-exists"),
        pytest.param(410, "Expired", client.Gone, id="410"),
        pytest.param(422, "Invalid", client.Invalid, id="422"),
        pytest.param(500, "InternalError", client.Transient, id="500"),
        pytest.param(503, "ServiceUnavailable", client.Transient, id="503"),
        pytest.param(429, "TooManyRequests", client.Transient, id="429"),
        pytest.param(403, "Forbidden", client.ApiError, id="403"),
    ],
)
def test_statuses_map_to_distinguishable_errors(status: int, reason: str, kind: type[client.ApiError]) -> None:
    """Guards: Conflict, AlreadyExists, NotFound, Gone, Invalid, transient errors told apart, with code and reason."""
    error = client.error_from_status(status, _status(status, reason, "the message"))
    assert type(error) is kind
    assert (error.status, error.reason, error.message) == (status, reason, "the message")
    assert str(error) == f"{status} {reason}: the message"


def test_a_non_status_body_becomes_the_message() -> None:
    """Guards: an answer that is not a Status object (a proxy's HTML page) still gives a readable error."""
    error = client.error_from_status(502, b"<html>bad gateway</html>")
    assert isinstance(error, client.Transient)
    assert "bad gateway" in error.message


def _slice(name: str, *, devices: list[dict[str, object]]) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n",
            "pool": {"name": "n", "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_decode_gives_model_values() -> None:
    """Guards: one raw object decodes into its model type."""
    value = client.decode(_slice("good", devices=[{"name": "gpu-0"}]))
    assert isinstance(value, model.ResourceSlice)
    assert [d.name for d in value.devices] == ["gpu-0"]


def test_an_object_that_does_not_decode_is_logged_by_name_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """Guards: a bad object gives None and a log line naming its kind and name; it does not block the others."""
    raws = [
        _slice("good", devices=[{"name": "gpu-0"}]),
        _slice("bad", devices=[{"name": "Not_A_Name"}]),
        _slice("also-good", devices=[{"name": "gpu-1"}]),
    ]
    with caplog.at_level(logging.WARNING, logger="dractl.kube.client"):
        values = [client.decode(raw) for raw in raws]
    assert [v.meta.name if v is not None else None for v in values] == ["good", None, "also-good"]
    assert "ResourceSlice bad" in caplog.text
    assert "devices[0].name" in caplog.text


def test_strict_decode_raises_a_message_naming_the_object() -> None:
    """Guards: with strict=True (the ClaimSource) a bad object raises BadObject naming the object and field."""
    with pytest.raises(client.BadObject, match="ResourceSlice bad.*devices\\[0\\].name"):
        client.decode(_slice("bad", devices=[{"name": "Not_A_Name"}]), strict=True)


def test_kinds_outside_the_model_decode_to_none() -> None:
    """Guards: a Lease or Event is not a model kind: None, without an error."""
    assert client.decode({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}}) is None
