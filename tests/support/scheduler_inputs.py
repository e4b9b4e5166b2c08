"""Builders of the raw API objects (JSON-shaped dicts, as the informers get them) the scheduler's tests feed in.

Defaults: namespace `ns`, driver `gpu.nvidia.com`, DeviceClass `gpu.nvidia.com` selecting every
device of the driver, nodes with 8 CPUs, 32Gi and 110 pods. Every builder returns a new dict.
"""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"
FINALIZER = "resource.kubernetes.io/delete-protection"


def pod(
    name: str = "trainer",
    *,
    scheduler: str = "dractl",
    claims: dict[str, str] | None = None,
    templates: dict[str, str] | None = None,
    recorded: dict[str, str | None] | None = None,
    node: str = "",
    cpu: str = "100m",
    conditions: list[dict[str, Any]] | None = None,
    version: str = "5",
    **spec: Any,
) -> dict[str, Any]:
    """A pod with direct claims (`claims`: pod claim -> claim) and template ones (`templates`: pod claim -> tpl)."""
    entries: list[dict[str, str]] = [{"name": key, "resourceClaimName": value} for key, value in (claims or {}).items()]
    entries += [{"name": key, "resourceClaimTemplateName": value} for key, value in (templates or {}).items()]
    body: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
        **spec,
    }
    if entries:
        body["resourceClaims"] = entries
    if node:
        body["nodeName"] = node
    status: dict[str, Any] = {"phase": "Pending"}
    if recorded is not None:
        status["resourceClaimStatuses"] = [
            {"name": key, "resourceClaimName": value} if value else {"name": key} for key, value in recorded.items()
        ]
    if conditions is not None:
        status["conditions"] = conditions
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": version},
        "spec": body,
        "status": status,
    }


def node(name: str = "n1", *, cpu: str = "8", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": "32Gi", "pods": "110"}},
    }


def resource_slice(node_name: str = "n1", *, gpus: int = 2) -> dict[str, Any]:
    """One slice for `node_name` with `gpus` devices `gpu-0`..."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-slice", "resourceVersion": "1"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node_name,
            "devices": [{"name": f"gpu-{index}", "attributes": {"type": {"string": "gpu"}}} for index in range(gpus)],
        },
    }


def device_class(name: str = CLASS) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim(
    name: str,
    *,
    count: int = 1,
    allocated_on: str = "",
    devices: tuple[str, ...] = ("gpu-0",),
    reserved: tuple[str, ...] = (),
    finalizer: bool = False,
    owner: str = "",
    version: str = "3",
    opaque: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A claim for `count` GPUs; `allocated_on` a node gives it `devices` there; `reserved` lists pod names; `opaque`
    gives its request these opaque parameters (`spec.devices.config`)."""
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": version}
    if finalizer:
        metadata["finalizers"] = [FINALIZER]
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"uid-{owner}", "controller": True}
        ]
        metadata["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    status: dict[str, Any] = {}
    if allocated_on:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": allocated_on, "device": device} for device in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [allocated_on]}]}
                ]
            },
        }
    if reserved:
        status["reservedFor"] = [
            {"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"} for pod_name in reserved
        ]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": count}}]}
    if opaque is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": opaque}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": devices},
        "status": status,
    }


def pod_group(name: str = "train", *, min_count: int | None = 4, key: str = "") -> dict[str, Any]:
    """A `scheduling.k8s.io/v1alpha2` PodGroup: a gang of `min_count` (None: the basic policy), in one domain of the
    node label `key` when given."""
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}} if min_count else {"basic": {}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": spec,
    }


def coscheduling_group(name: str = "train", *, min_member: int = 4, timeout: int | None = None) -> dict[str, Any]:
    """A scheduler-plugins `scheduling.x-k8s.io/v1alpha1` PodGroup (the seed article's)."""
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": spec,
    }


def member(name: str, *, group: str = "train", claim: str = "", **more: Any) -> dict[str, Any]:
    """A pod of this scheduler joining the v1alpha2 PodGroup `group`, with the direct claim `claim` (default: its own
    name) as pod claim `gpu`."""
    return pod(name, claims={"gpu": claim or name}, schedulingGroup={"podGroupName": group}, **more)
