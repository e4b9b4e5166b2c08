"""API objects the tests against a real kube-apiserver create: claims, templates, pods, nodes, allocations.

What it does: builds the JSON bodies (plain dicts, `resource.k8s.io/v1` and `v1`) the way a user,
kube-controller-manager or a scheduler would write them, and offers the few create-then-write-status
steps several tests take (an allocated claim, a Ready node, a namespace with its ServiceAccount).
The builders are pure; the `create_*`/`make_*` helpers issue exactly the requests their docstrings name.

What it must not do: hold fixtures (they stay in conftest.py) or wait for anything.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dractl.kube import client, finalizers

GPU_CLASS = "gpu.nvidia.com"
DRIVER = "gpu.nvidia.com"
IMAGE = "registry.k8s.io/pause:3.10"
SERVICE_ACCOUNTS = client.Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
# No kubelet runs beside the test API server: tests create Ready nodes with this capacity themselves.
NODE_ALLOCATABLE = {"cpu": "32", "memory": "256Gi", "pods": "110"}


def claim_spec(device_class: str = GPU_CLASS, *, request: str = "gpu", count: int = 1) -> dict[str, Any]:
    """A claim spec asking for `count` devices of `device_class` in one request named `request`."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count != 1:
        exactly["count"] = count
    return {"devices": {"requests": [{"name": request, "exactly": exactly}]}}


ONE_GPU = claim_spec()


def claim(
    name: str,
    *,
    namespace: str,
    spec: Mapping[str, Any] = ONE_GPU,
    annotations: Mapping[str, str] | None = None,
    finalizers: Sequence[str] = (),
    owner: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim; `owner` (a created Pod) makes it that pod's generated claim (controller owner reference).

    The claim holds a deep copy of `spec`: changing one never changes the other (or `ONE_GPU`).
    """
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    if owner is not None:
        metadata["ownerReferences"] = [controller_reference(owner)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": copy.deepcopy(dict(spec)),
    }


def template(
    name: str, *, namespace: str, spec: Mapping[str, Any] = ONE_GPU, claim_metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A ResourceClaimTemplate whose claims get `spec` (and `claim_metadata`: labels, annotations).

    The template holds deep copies of `spec` and `claim_metadata`: changing one never changes the other.
    """
    body: dict[str, Any] = {"spec": copy.deepcopy(dict(spec))}
    if claim_metadata is not None:
        body["metadata"] = copy.deepcopy(dict(claim_metadata))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def from_template(template_name: str, *, pod_claim: str = "gpu") -> dict[str, str]:
    """A pod's spec.resourceClaims entry that asks for a claim made from a template."""
    return {"name": pod_claim, "resourceClaimTemplateName": template_name}


def of_claim(claim_name: str, *, pod_claim: str = "gpu") -> dict[str, str]:
    """A pod's spec.resourceClaims entry that names an existing claim."""
    return {"name": pod_claim, "resourceClaimName": claim_name}


def pod(
    name: str, *, namespace: str, claims: Sequence[Mapping[str, str]], cpu: str = "", **spec: Any
) -> dict[str, Any]:
    """A Pod of one pause container (requesting `cpu` when given) with `claims`; `spec` adds pod spec fields."""
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**spec, "containers": [container], "resourceClaims": [dict(entry) for entry in claims]},
    }


def pod_group(name: str, *, namespace: str, claims: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """A `scheduling.k8s.io/v1alpha2` PodGroup of the basic policy with `claims` as its spec.resourceClaims."""
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulingPolicy": {"basic": {}}, "resourceClaims": [dict(entry) for entry in claims]},
    }


def group_member(
    name: str, *, namespace: str, group: str, claims: Sequence[Mapping[str, str]], **spec: Any
) -> dict[str, Any]:
    """A pod joining PodGroup `group` (spec.schedulingGroup), left to a scheduler nobody runs unless `spec` names
    one or a node."""
    return pod(
        name,
        namespace=namespace,
        claims=claims,
        **{"schedulerName": "nobody", "schedulingGroup": {"podGroupName": group}, **spec},
    )


def group_reference(group: Mapping[str, Any]) -> dict[str, str]:
    """The reservedFor entry naming a created PodGroup."""
    uid = group["metadata"]["uid"]
    return {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": group["metadata"]["name"], "uid": uid}


def controller_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller owner reference to a created Pod, as the claim controller writes it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def reserved_for(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """A claim's status.reservedFor listing the created `pods`."""
    return [{"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods]


def allocation(pool: str, devices: Iterable[str], *, request: str = "gpu", node: str | None = None) -> dict[str, Any]:
    """A claim's status.allocation of `devices` in `pool` for `request`; `node` adds a scheduler's node selector."""
    allocated: dict[str, Any] = {
        "devices": {
            "results": [{"request": request, "driver": DRIVER, "pool": pool, "device": device} for device in devices]
        }
    }
    if node is not None:
        allocated["nodeSelector"] = {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        }
    return allocated


def create_allocated_claim(
    api: client.Client, name: str, *, namespace: str, spec: Mapping[str, Any], allocated: Mapping[str, Any]
) -> dict[str, Any]:
    """Create a claim and write `allocated` as its status.allocation (two requests); returns the created claim."""
    created = api.create(client.RESOURCE_CLAIMS, claim(name, namespace=namespace, spec=spec))
    api.update_status(client.RESOURCE_CLAIMS, {**created, "status": {"allocation": dict(allocated)}})
    return created


def _protobuf_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (field numbers under 16: a one-byte key)."""
    length, size = bytearray(), len(payload)
    while size >= 0x80:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return bytes([number << 3 | 2]) + bytes(length) + payload


def protobuf_object(
    *, uid: str, resource_version: str, finalizers_: Sequence[str], spec: bytes = b"spec", other_meta: bytes = b""
) -> bytes:
    """An object as `Client.get_protobuf` returns it, with only what `dractl.kube.finalizers` reads (uid,
    resourceVersion, finalizers), then `other_meta` (encoded metadata fields), and `spec` as the bytes of its spec:
    for stub clients and unit tests."""
    meta = _protobuf_field(5, uid.encode()) + _protobuf_field(6, resource_version.encode())
    meta += b"".join(_protobuf_field(14, item.encode()) for item in finalizers_) + other_meta
    return finalizers.MAGIC + _protobuf_field(2, _protobuf_field(1, meta) + _protobuf_field(2, spec))


def make_ready(api: client.Client, name: str, *, allocatable: Mapping[str, str] = NODE_ALLOCATABLE) -> None:
    """Give node `name` allocatable resources and a Ready condition, as its kubelet would (one status patch).

    A merge patch, not an update: kube-controller-manager (when a test started it) annotates new
    nodes, so the version the create returned may already be stale.
    """
    api.patch(
        client.NODES,
        name,
        subresource="status",
        patch={
            "status": {
                "allocatable": dict(allocatable),
                "capacity": dict(allocatable),
                "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "no kubelet"}],
            }
        },
    )


def make_namespace(api: client.Client, name: str) -> None:
    """Create namespace `name` and its `default` ServiceAccount (made by hand since no controller manager may run)."""
    api.create(client.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        api.create(SERVICE_ACCOUNTS, {"metadata": {"name": "default", "namespace": name}})
    except client.AlreadyExists:
        pass  # The controller manager's service account controller was faster.
