"""The kube client against a real kube-apiserver: CRUD on DRA and core objects, preconditions, errors, decoding, and
which failed requests it sends again (faults from the fault proxy)."""

from __future__ import annotations

import concurrent.futures
import threading

import controlplane
import faultproxy
import pytest

from dractl import model
from dractl.kube import client, finalizers

pytestmark = pytest.mark.timeout(120)


def _claim(name: str, namespace: str, *, selector: str = 'device.driver == "gpu.nvidia.com"') -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def test_create_get_list_delete_a_resource_claim(kube_client: client.Client, namespace: str) -> None:
    """Guards: a claim created through the client is read back, listed in its namespace, decoded, and deleted."""
    created = kube_client.create(client.RESOURCE_CLAIMS, _claim("c1", namespace))
    assert created["metadata"]["resourceVersion"]
    assert (
        kube_client.get(client.RESOURCE_CLAIMS, "c1", namespace=namespace)["metadata"]["uid"]
        == created["metadata"]["uid"]
    )
    listed = kube_client.list(client.RESOURCE_CLAIMS, namespace=namespace)
    assert [item["metadata"]["name"] for item in listed.items] == ["c1"]
    assert listed.resource_version
    claim = kube_client.get_resource_claim(namespace, "c1")
    assert isinstance(claim, model.ResourceClaim)
    assert claim.meta.namespace == namespace
    assert claim.spec.requests[0].exactly is not None
    assert claim.spec.requests[0].exactly.device_class_name == "gpu.nvidia.com"
    kube_client.delete(client.RESOURCE_CLAIMS, "c1", namespace=namespace)
    with pytest.raises(client.NotFound):
        kube_client.get(client.RESOURCE_CLAIMS, "c1", namespace=namespace)


def test_create_of_an_existing_name_is_already_exists(kube_client: client.Client, namespace: str) -> None:
    """Guards: a duplicate create raises AlreadyExists (distinguishable from a Conflict)."""
    kube_client.create(client.RESOURCE_CLAIMS, _claim("dup", namespace))
    with pytest.raises(client.AlreadyExists) as raised:
        kube_client.create(client.RESOURCE_CLAIMS, _claim("dup", namespace))
    assert not isinstance(raised.value, client.Conflict)
    assert raised.value.status == 409
    assert raised.value.reason == "AlreadyExists"


def test_a_stale_resource_version_on_update_is_a_conflict(kube_client: client.Client, namespace: str) -> None:
    """Guards: update sends metadata.resourceVersion as precondition; a stale one is a Conflict, a fresh one wins."""
    first = kube_client.create(client.RESOURCE_CLAIMS, _claim("rv", namespace))
    labelled = {**first, "metadata": {**first["metadata"], "labels": {"a": "1"}}}
    second = kube_client.update(client.RESOURCE_CLAIMS, labelled)
    assert second["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    stale = {**first, "metadata": {**first["metadata"], "labels": {"a": "2"}}}
    with pytest.raises(client.Conflict) as raised:
        kube_client.update(client.RESOURCE_CLAIMS, stale)
    assert raised.value.status == 409
    assert kube_client.get(client.RESOURCE_CLAIMS, "rv", namespace=namespace)["metadata"]["labels"] == {"a": "1"}


def test_update_without_a_resource_version_is_refused_before_sending(kube_client: client.Client) -> None:
    """Guards: an update without a precondition is a programming error, named, not a blind overwrite."""
    with pytest.raises(ValueError, match="resourceVersion is required"):
        kube_client.update(client.RESOURCE_CLAIMS, {"metadata": {"name": "x", "namespace": "default"}})


def test_merge_patch_with_a_stale_resource_version_is_a_conflict(kube_client: client.Client, namespace: str) -> None:
    """Guards: a merge patch carrying an old metadata.resourceVersion fails with Conflict; without it, it applies."""
    first = kube_client.create(client.RESOURCE_CLAIMS, _claim("mp", namespace))
    patched = kube_client.patch(client.RESOURCE_CLAIMS, "mp", {"metadata": {"labels": {"x": "1"}}}, namespace=namespace)
    assert patched["metadata"]["labels"] == {"x": "1"}
    with pytest.raises(client.Conflict):
        kube_client.patch(
            client.RESOURCE_CLAIMS,
            "mp",
            namespace=namespace,
            patch={"metadata": {"resourceVersion": first["metadata"]["resourceVersion"], "labels": {"x": "2"}}},
        )


def test_a_finalizer_added_with_a_patch_keeps_the_spec_bytes_and_a_stale_version_writes_nothing(
    kube_client: client.Client, namespace: str
) -> None:
    """Guards: `finalizers.add_with_patch` on a claim without opaque configuration (selectors, a capacity request):
    the finalizer is appended to the ones there, the stored spec is the same bytes after the API server's JSON round
    trip, a second call finds it there and sends nothing, and a call at a stale resourceVersion is a Conflict that
    changes nothing."""
    body = _claim("fin", namespace)
    body["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "8Gi"}}
    body["metadata"]["finalizers"] = ["example.com/first"]
    created = kube_client.create(client.RESOURCE_CLAIMS, body)
    version = created["metadata"]["resourceVersion"]
    before = finalizers.read(kube_client.get_protobuf(client.RESOURCE_CLAIMS, "fin", namespace=namespace))
    wanted = "resource.kubernetes.io/delete-protection"
    stored = finalizers.add_with_patch(
        kube_client,
        client.RESOURCE_CLAIMS,
        "fin",
        namespace=namespace,
        resource_version=version,
        finalizers=before.finalizers,
        add=wanted,
    )
    assert stored is not None and stored["metadata"]["finalizers"] == ["example.com/first", wanted]
    after = finalizers.read(kube_client.get_protobuf(client.RESOURCE_CLAIMS, "fin", namespace=namespace))
    assert after.sections[2] == before.sections[2]
    assert (
        finalizers.add_with_patch(
            kube_client,
            client.RESOURCE_CLAIMS,
            "fin",
            namespace=namespace,
            resource_version=after.resource_version,
            finalizers=after.finalizers,
            add=wanted,
        )
        is None
    )
    with pytest.raises(client.Conflict):
        finalizers.add_with_patch(
            kube_client,
            client.RESOURCE_CLAIMS,
            "fin",
            namespace=namespace,
            resource_version=version,
            finalizers=("example.com/first",),
            add="example.com/second",
        )
    final = kube_client.get(client.RESOURCE_CLAIMS, "fin", namespace=namespace)
    assert final["metadata"]["finalizers"] == ["example.com/first", wanted]
    assert final["metadata"]["resourceVersion"] == after.resource_version
    for name in final["metadata"]["finalizers"]:  # Let the namespace go.
        latest = kube_client.get(client.RESOURCE_CLAIMS, "fin", namespace=namespace)
        finalizers.change(
            kube_client,
            client.RESOURCE_CLAIMS,
            "fin",
            namespace=namespace,
            resource_version=latest["metadata"]["resourceVersion"],
            remove=name,
        )


def test_json_patch_and_server_side_apply(kube_client: client.Client, namespace: str) -> None:
    """Guards: JSON patch (with a test op as precondition) and server-side apply under field manager dractl."""
    kube_client.create(client.RESOURCE_CLAIMS, _claim("jp", namespace))
    patched = kube_client.patch(
        client.RESOURCE_CLAIMS,
        "jp",
        [{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}],
        namespace=namespace,
        type=client.PatchType.JSON,
    )
    assert patched["metadata"]["annotations"] == {"k": "v"}
    with pytest.raises(client.Invalid):
        kube_client.patch(
            client.RESOURCE_CLAIMS,
            "jp",
            [{"op": "test", "path": "/metadata/annotations/k", "value": "other"}],
            namespace=namespace,
            type=client.PatchType.JSON,
        )
    applied = kube_client.patch(
        client.RESOURCE_CLAIMS,
        "jp",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "jp", "namespace": namespace, "labels": {"owned-by": "dractl"}},
        },
        namespace=namespace,
        type=client.PatchType.APPLY,
    )
    assert applied["metadata"]["labels"] == {"owned-by": "dractl"}
    managers = {entry["manager"] for entry in applied["metadata"]["managedFields"]}
    assert "dractl" in managers


def test_status_update_writes_the_allocation_and_ignores_the_spec(kube_client: client.Client, namespace: str) -> None:
    """Guards: update_status writes status.allocation through the status subresource with its precondition."""
    created = kube_client.create(client.RESOURCE_CLAIMS, _claim("st", namespace))
    allocation = {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]},
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]
        },
    }
    updated = kube_client.update_status(client.RESOURCE_CLAIMS, {**created, "status": {"allocation": allocation}})
    assert updated["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    claim = kube_client.get_resource_claim(namespace, "st")
    assert claim.allocation is not None
    assert [r.device for r in claim.allocation.results] == ["gpu-0"]
    with pytest.raises(client.Conflict):
        kube_client.update_status(client.RESOURCE_CLAIMS, {**created, "status": {}})


def test_invalid_objects_are_refused_with_the_field_named(kube_client: client.Client, namespace: str) -> None:
    """Guards: a claim whose CEL does not compile is refused as Invalid, and the message names the field."""
    with pytest.raises(client.Invalid) as raised:
        kube_client.create(client.RESOURCE_CLAIMS, _claim("bad", namespace, selector="device.driver =="))
    assert raised.value.status == 422
    assert "selectors" in raised.value.message


def test_delete_with_a_stale_resource_version_precondition_is_a_conflict(
    kube_client: client.Client, namespace: str
) -> None:
    """Guards: delete's resourceVersion precondition protects a changed object; a missing object is NotFound."""
    first = kube_client.create(client.RESOURCE_CLAIMS, _claim("del", namespace))
    kube_client.patch(client.RESOURCE_CLAIMS, "del", {"metadata": {"labels": {"x": "1"}}}, namespace=namespace)
    with pytest.raises(client.Conflict):
        kube_client.delete(
            client.RESOURCE_CLAIMS, "del", namespace=namespace, resource_version=first["metadata"]["resourceVersion"]
        )
    kube_client.delete(client.RESOURCE_CLAIMS, "del", namespace=namespace)
    with pytest.raises(client.NotFound):
        kube_client.delete(client.RESOURCE_CLAIMS, "del", namespace=namespace)


def test_cluster_scoped_device_classes_slices_nodes_and_templates(kube_client: client.Client, namespace: str) -> None:
    """Guards: the other kinds (DeviceClass, ResourceSlice, Node, ResourceClaimTemplate, Pod) round-trip and decode."""
    suffix = namespace
    kube_client.create(
        client.DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"gpu-{suffix}"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]},
        },
    )
    kube_client.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{suffix}"}})
    kube_client.create(
        client.RESOURCE_SLICES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"slice-{suffix}"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": f"node-{suffix}",
                "pool": {"name": f"node-{suffix}", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
            },
        },
    )
    kube_client.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "tpl", "namespace": namespace},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": f"gpu-{suffix}"}}]}}
            },
        },
    )
    kube_client.create(
        client.PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": namespace},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}],
            },
        },
    )
    slices, version = kube_client.list_resource_slices(field_selector=f"spec.nodeName=node-{suffix}")
    assert version
    assert [(s.meta.name, s.pool.generation, [d.name for d in s.devices]) for s in slices] == [
        (f"slice-{suffix}", 1, ["gpu-0"])
    ]
    kinds = {
        client.DEVICE_CLASSES: (f"gpu-{suffix}", "", model.DeviceClass),
        client.NODES: (f"node-{suffix}", "", model.Node),
        client.RESOURCE_CLAIM_TEMPLATES: ("tpl", namespace, model.ResourceClaimTemplate),
        client.PODS: ("p", namespace, model.Pod),
    }
    for resource, (name, ns, kind) in kinds.items():
        raw = kube_client.get(resource, name, namespace=ns)
        value = client.decode({"apiVersion": resource.api_version, "kind": resource.kind, **raw})
        assert isinstance(value, kind), resource.kind
    pod = client.decode(kube_client.get(client.PODS, "p", namespace=namespace))
    assert isinstance(pod, model.Pod)
    assert [c.resource_claim_template_name for c in pod.resource_claims] == ["tpl"]


def test_missing_namespace_is_not_found(kube_client: client.Client) -> None:
    """Guards: a read in a namespace that does not exist raises NotFound with the server's message."""
    with pytest.raises(client.NotFound, match="not found"):
        kube_client.get(client.RESOURCE_CLAIMS, "x", namespace="no-such-namespace-here")


def test_the_log_of_a_missing_pod_is_not_found_and_of_an_unbound_pod_empty(
    kube_client: client.Client, namespace: str
) -> None:
    """Guards: read_log of a missing pod raises NotFound; a pod no node runs yet has an empty log (the API server
    answers 200 with no text). The log of a running container is read in e2e/ on a real kubelet."""
    with pytest.raises(client.NotFound):
        kube_client.read_log(namespace, "nobody")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace}}
    pod["spec"] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    kube_client.create(client.PODS, pod)
    assert kube_client.read_log(namespace, "p", container="main") == ""


def test_list_follows_continue_tokens(
    kube_client: client.Client, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: a list longer than one page is read to the end through continue tokens."""
    monkeypatch.setattr(client, "_LIST_PAGE", 2)
    for i in range(5):
        kube_client.create(client.RESOURCE_CLAIMS, _claim(f"page-{i}", namespace))
    listed = kube_client.list(client.RESOURCE_CLAIMS, namespace=namespace)
    assert sorted(item["metadata"]["name"] for item in listed.items) == [f"page-{i}" for i in range(5)]
    assert all(item["kind"] == "ResourceClaim" for item in listed.items)


def _generated(namespace: str) -> dict[str, object]:
    """A claim whose name the server picks (generateName), as the claim controller creates them."""
    body = _claim("unused", namespace)
    body["metadata"] = {"generateName": "pod-gpu-", "namespace": namespace}
    return body


def _claim_names(api: client.Client, namespace: str) -> list[str]:
    return sorted(item["metadata"]["name"] for item in api.list(client.RESOURCE_CLAIMS, namespace=namespace).items)


def test_a_create_whose_answer_is_cut_after_the_server_committed_it_leaves_exactly_one_claim(
    proxied_client: client.Client, kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a POST with generateName whose answer is lost after the server created the claim is not sent again
    (a second would make a second claim): the caller gets Transient, and the namespace holds exactly one claim."""
    fault_proxy.add(faultproxy.cut_answer(method="POST", path="/resourceclaims"))
    with pytest.raises(client.Transient) as raised:
        proxied_client.create(client.RESOURCE_CLAIMS, _generated(namespace))
    assert not raised.value.unsent
    assert [(r.method, r.status, r.fault) for r in fault_proxy.requests] == [("POST", 201, "cut answer")]
    [name] = _claim_names(kube_client, namespace)
    assert name.startswith("pod-gpu-")


WRITE_FAULTS = {
    "post-503": (faultproxy.respond(503, method="POST"), 1, 0),
    "post-503-retry-after": (faultproxy.respond(503, method="POST", retry_after=0), 1, 0),
    "post-500-forever": (faultproxy.respond(500, method="POST", count=None), 1, 0),
    "post-429": (faultproxy.respond(429, method="POST", retry_after=0), 2, 1),
    "post-429-twice": (faultproxy.respond(429, method="POST", retry_after=0, count=2), 3, 1),
}


@pytest.mark.parametrize(("rule", "posts", "claims"), list(WRITE_FAULTS.values()), ids=list(WRITE_FAULTS))
def test_a_create_is_sent_again_only_when_the_server_turned_it_away(
    proxied_client: client.Client,
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    rule: faultproxy.Rule,
    posts: int,
    claims: int,
) -> None:
    """Guards: a generateName create answered 5xx (with or without Retry-After) is sent once and raises Transient;
    one answered 429 (refused unread) is sent again until it is created: exactly one claim either way."""
    fault_proxy.add(rule)
    if claims:
        created = proxied_client.create(client.RESOURCE_CLAIMS, _generated(namespace))
        assert _claim_names(kube_client, namespace) == [created["metadata"]["name"]]
    else:
        with pytest.raises(client.Transient):
            proxied_client.create(client.RESOURCE_CLAIMS, _generated(namespace))
        assert _claim_names(kube_client, namespace) == []
    assert [r.method for r in fault_proxy.requests] == ["POST"] * posts


def test_a_read_whose_answer_is_cut_is_sent_again(
    proxied_client: client.Client, kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a GET whose answer broke off is sent again and returns the object."""
    kube_client.create(client.RESOURCE_CLAIMS, _claim("read", namespace))
    fault_proxy.add(faultproxy.cut_answer(method="GET", path="/resourceclaims/read"))
    assert proxied_client.get(client.RESOURCE_CLAIMS, "read", namespace=namespace)["metadata"]["name"] == "read"
    assert [(r.method, r.fault) for r in fault_proxy.requests] == [("GET", "cut answer"), ("GET", "")]


def test_a_patch_is_sent_again_after_a_retry_after_but_not_after_a_cut_answer(
    proxied_client: client.Client, kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a PATCH answered 503 with Retry-After is sent again (and lands); a PATCH whose answer is cut after the
    server applied it is not sent again: Transient, and the patch is there once."""
    kube_client.create(client.RESOURCE_CLAIMS, _claim("p", namespace))
    fault_proxy.add(faultproxy.respond(503, method="PATCH", retry_after=0))
    patched = proxied_client.patch(
        client.RESOURCE_CLAIMS, "p", {"metadata": {"labels": {"a": "1"}}}, namespace=namespace
    )
    assert patched["metadata"]["labels"] == {"a": "1"}
    assert [(r.method, r.status) for r in fault_proxy.requests] == [("PATCH", 503), ("PATCH", 200)]
    fault_proxy.clear()
    fault_proxy.add(faultproxy.cut_answer(method="PATCH"))
    with pytest.raises(client.Transient):
        proxied_client.patch(client.RESOURCE_CLAIMS, "p", {"metadata": {"labels": {"b": "2"}}}, namespace=namespace)
    assert [(r.method, r.fault) for r in fault_proxy.requests] == [("PATCH", "cut answer")]
    labels = kube_client.get(client.RESOURCE_CLAIMS, "p", namespace=namespace)["metadata"]["labels"]
    assert labels == {"a": "1", "b": "2"}


def test_a_burst_of_concurrent_requests_reuses_its_connections(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    """Guards connection reuse: two bursts of 24 GETs at once (more than the official client's 5 per CPU) open
    at most 24 connections in all (a connection thrown away after one use costs a TLS handshake each time)."""
    api = client.connect(control_plane.kubeconfig)
    try:
        api.create(client.RESOURCE_CLAIMS, _claim("c", namespace))
        pool = api.api_client.rest_client.pool_manager.connection_from_url(api.host)
        start = threading.Barrier(24)

        def get() -> None:
            start.wait(timeout=30)
            api.get_resource_claim(namespace, "c")

        def burst() -> None:
            with concurrent.futures.ThreadPoolExecutor(24) as threads:
                for done in [threads.submit(get) for _ in range(24)]:
                    done.result(timeout=60)

        burst()
        burst()
        # Never more connections than requests at once: the second burst found the first one's waiting in the pool.
        assert pool.num_connections <= 24
    finally:
        api.close()
