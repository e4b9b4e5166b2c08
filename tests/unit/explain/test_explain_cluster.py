"""How `dractl explain` reads the cluster: decoding one object at a time, and one-line errors."""

from __future__ import annotations

import pytest
from support import explain_api as api

from dractl import model
from dractl.explain import cluster
from dractl.kube import client as kube_client


def _cluster(**extra: list[dict[str, object]]) -> api.FakeReader:
    objects = {
        "deviceclasses": [api.device_class()],
        "resourceslices": [api.resource_slice("node-a", "gpu-0", "gpu-1")],
        "nodes": [api.node("node-a")],
        "resourceclaims": [api.resource_claim("ns", "c")],
    }
    objects.update(extra)
    return api.FakeReader(objects)


def test_the_cluster_state_is_decoded_into_model_values() -> None:
    """Guards: classes, slices, nodes and claims of every namespace are read and decoded."""
    reader = _cluster(resourceclaims=[api.resource_claim("ns", "c"), api.resource_claim("other", "d")])
    state = cluster.read_cluster(reader)
    assert [c.meta.name for c in state.objects.device_classes] == ["gpu.example.com"]
    assert [s.meta.name for s in state.objects.resource_slices] == ["node-a-gpu.example.com"]
    assert [n.meta.name for n in state.objects.nodes] == ["node-a"]
    assert [c.key for c in state.objects.resource_claims] == ["ns/c", "other/d"]
    assert state.warnings == ()


def test_an_object_dractl_cannot_decode_is_a_warning_naming_it_and_is_skipped() -> None:
    """Guards: a malformed slice is named in a warning and skipped; the other slices are still read."""
    bad = api.resource_slice("node-b", "gpu-0")
    bad["spec"]["pool"]["resourceSliceCount"] = "many"
    reader = _cluster(resourceslices=[bad, api.resource_slice("node-a", "gpu-0")])
    state = cluster.read_cluster(reader)
    assert [s.meta.name for s in state.objects.resource_slices] == ["node-a-gpu.example.com"]
    [warning] = state.warnings
    assert warning.startswith("skipping ResourceSlice node-b-gpu.example.com: dractl cannot decode it: ")
    assert "spec.pool.resourceSliceCount" in warning


def test_a_missing_claim_or_pod_is_not_found_naming_it() -> None:
    """Guards: a claim or pod that does not exist raises NotFound with the object and the server."""
    reader = _cluster()
    with pytest.raises(cluster.NotFound, match=r"^ResourceClaim ns/nope not found on the API server https://api"):
        cluster.read_claim(reader, "ns", "nope")
    with pytest.raises(cluster.NotFound, match=r"^Pod ns/nope not found on the API server https://api"):
        cluster.read_pod(reader, "ns", "nope")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        pytest.param(
            kube_client.ApiError(403, "Forbidden", 'resourceslices is forbidden: User "bob" cannot list'),
            "the API server https://api.test:6443 refuses to list resourceslices: 403 Forbidden: resourceslices is "
            'forbidden: User "bob" cannot list',
            id="forbidden",
        ),
        pytest.param(
            kube_client.Transient(0, "ConnectionFailed", "Connection refused"),
            "cannot reach the API server https://api.test:6443 to list resourceslices: Connection refused",
            id="unreachable",
        ),
        pytest.param(
            kube_client.Transient(503, "ServiceUnavailable", "etcd is down"),
            "cannot list resourceslices on the API server https://api.test:6443: 503 ServiceUnavailable: etcd is down",
            id="server-error",
        ),
    ],
)
def test_a_failing_list_is_one_line_naming_the_server_and_the_resource(
    error: kube_client.ApiError, expected: str
) -> None:
    """Guards: a refused or unanswered list becomes a ReadError naming the server and the resource."""
    reader = api.FakeReader({"deviceclasses": []}, errors={"resourceslices": error})
    with pytest.raises(cluster.ReadError) as raised:
        cluster.read_cluster(reader)
    assert str(raised.value) == expected


def test_a_target_that_does_not_decode_is_an_error_not_a_traceback() -> None:
    """Guards: the claim asked about cannot be skipped: when it does not decode, the error names it and the field."""
    bad = api.resource_claim("ns", "c")
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    reader = _cluster(resourceclaims=[bad])
    with pytest.raises(
        cluster.ReadError, match=r"^ResourceClaim ns/c cannot be explained: dractl cannot decode it: .*count"
    ):
        cluster.read_claim(reader, "ns", "c")


def test_a_pod_brings_its_recorded_claims_and_its_templates() -> None:
    """Guards: read_pod decodes the pod, its resourceClaimStatuses (None for "no claim needed") and its templates."""
    raw_pod = api.pod("ns", "p", templates={"g": "t", "h": "gone"}, statuses={"g": "p-g-abcde", "h": None})
    reader = api.FakeReader({"pods": [raw_pod], "resourceclaimtemplates": [api.template("ns", "t")]})
    read = cluster.read_pod(reader, "ns", "p")
    assert isinstance(read.pod, model.Pod)
    assert read.claim_statuses == {"g": "p-g-abcde", "h": None}
    assert list(read.templates) == ["t"]
    assert read.warnings == ()


def test_claim_statuses_ignore_malformed_entries() -> None:
    """Guards: resourceClaimStatuses entries without a name, or a status that is not an object, are ignored."""
    raw = {
        "status": {
            "resourceClaimStatuses": [{"resourceClaimName": "x"}, "junk", {"name": "g", "resourceClaimName": ""}]
        }
    }
    assert cluster.claim_statuses(raw) == {"g": None}
    assert cluster.claim_statuses({"status": "weird"}) == {}
