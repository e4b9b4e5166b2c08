"""What the end-to-end suites check, shared by the real-node suite and the kind suite.

What it does: the seed patterns of ../shared/seeds/ as manifests a user applies (e2e/manifests/), with
each container replaced by a workload that prints its environment between markers and then waits
(exiting at once on SIGTERM); applying and deleting manifests through dractl.kube; reading a
container's environment from its log (the API server's `pods/log`, served by the node's kubelet,
as `kubectl logs` reads it); waiting for pods, claims and slices with bounded deadlines; and the
checks themselves (devices in each container, claims allocated as the pattern demands).

What it must not do: know how the cluster was made (real node or kind): what it needs of the nodes
(their CDI files, a file of theirs) comes through the `Nodes` protocol.
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import controlplane
import node_images
import yaml

from dractl.kube import client

HERE = pathlib.Path(__file__).resolve().parent
MANIFESTS = HERE / "manifests"
BEGIN, END = "--- environment", "--- end"
# Print the environment once, then wait; SIGTERM ends the loop at once (sh is PID 1 of the container,
# which ignores signals it has no handler for, so the trap matters).
WORKLOAD_SCRIPT = f"echo '{BEGIN}'; env | sort; echo '{END}'; trap 'exit 0' TERM; while :; do sleep 1; done"
GPU_DRIVER = "gpu.nvidia.com"

_RESOURCES = {
    (r.api_version, r.kind): r
    for r in (
        client.RESOURCE_CLAIMS,
        client.RESOURCE_CLAIM_TEMPLATES,
        client.DEVICE_CLASSES,
        client.PODS,
        client.NAMESPACES,
        client.Resource("apps", "v1", "deployments", "Deployment", namespaced=True),
        client.Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True),
        client.Resource("batch", "v1", "jobs", "Job", namespaced=True),
        client.Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
        client.Resource("", "v1", "configmaps", "ConfigMap", namespaced=True),
        client.Resource("", "v1", "services", "Service", namespaced=True),
        client.Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
        client.Resource(
            "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
        ),
        client.Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
        client.Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True),
        client.Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True),
        client.Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
        client.Resource(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            namespaced=False,
        ),
        client.Resource(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            namespaced=False,
        ),
    )
}


class Nodes(Protocol):
    """What the checks need to see on a node, however the cluster was made."""

    def cdi_files(self, node: str) -> list[str]:
        """The file names in the node's CDI directory (/var/run/cdi)."""
        ...

    def read(self, node: str, path: str) -> str:
        """A file's text on the node (as a hostPath mount would show it)."""
        ...


def resource(document: Mapping[str, Any]) -> client.Resource:
    """The API resource of a manifest; ValueError naming the kind when the suites never apply such objects."""
    key = (str(document.get("apiVersion")), str(document.get("kind")))
    if key not in _RESOURCES:
        raise ValueError(
            f"{document.get('kind')} {document.get('metadata', {}).get('name')}: {key} is not a kind "
            "the suites apply (add it to scenarios._RESOURCES)"
        )
    return _RESOURCES[key]


def load(path: pathlib.Path) -> list[dict[str, Any]]:
    """The documents of a YAML manifest file, empty ones dropped."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def apply(api: client.Client, documents: Iterable[Mapping[str, Any]], *, namespace: str = "") -> None:
    """Server-side apply each document (force, field manager of `api`), in `namespace` when it has none."""
    for document in documents:
        body = copy.deepcopy(dict(document))
        target = resource(body)
        metadata = body.setdefault("metadata", {})
        if target.namespaced and namespace and not metadata.get("namespace"):
            metadata["namespace"] = namespace
        api.patch(
            target,
            metadata["name"],
            body,
            namespace=metadata.get("namespace", ""),
            type=client.PatchType.APPLY,
            force=True,
        )


def delete(api: client.Client, documents: Iterable[Mapping[str, Any]], *, namespace: str = "") -> None:
    """Delete each document's object; one already gone is fine."""
    for document in documents:
        metadata = document.get("metadata") or {}
        try:
            api.delete(resource(document), metadata["name"], namespace=metadata.get("namespace") or namespace)
        except client.NotFound:
            pass


def as_workload(document: Mapping[str, Any], *, image: str, pull_policy: str = "Never") -> dict[str, Any]:
    """The manifest with every container (of a Pod, or of a Deployment's, Job's or DaemonSet's pod template)
    running `image` with the workload script: print the environment, then wait. Pure."""
    body = copy.deepcopy(dict(document))
    spec = body.get("spec") or {}
    pod_spec = spec if body.get("kind") == "Pod" else (spec.get("template") or {}).get("spec")
    if pod_spec is None:
        return body
    for container in [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]:
        container["image"] = image
        container["imagePullPolicy"] = pull_policy
        container["command"] = ["sh", "-c", WORKLOAD_SCRIPT]
        container.pop("args", None)
    return body


def workload_pod(
    name: str,
    *,
    namespace: str,
    claims: Mapping[str, Mapping[str, str]],
    image: str = node_images.BUSYBOX,
    pull_policy: str = "Never",
) -> dict[str, Any]:
    """A Pod of one workload container (`main`) that uses every claim of `claims` (pod claim name -> source, as
    `kube_objects.from_template`/`of_claim` give). Pure."""
    entries = [{**source, "name": claim} for claim, source in claims.items()]
    container = {"name": "main", "resources": {"claims": [{"name": claim} for claim in claims]}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"resourceClaims": entries, "containers": [container]},
    }
    return as_workload(pod, image=image, pull_policy=pull_policy)


def environment(api: client.Client, namespace: str, pod: str, container: str = "") -> dict[str, str] | None:
    """The environment a workload container printed (None while it has not printed it all yet)."""
    try:
        text = api.read_log(namespace, pod, container=container)
    except client.ApiError:
        return None
    lines = text.splitlines()
    if BEGIN not in lines or END not in lines:
        return None
    body = lines[lines.index(BEGIN) + 1 : lines.index(END)]
    return dict(line.split("=", 1) for line in body if "=" in line)


def visible_devices(env: Mapping[str, str]) -> list[str]:
    """The GPU UUIDs in NVIDIA_VISIBLE_DEVICES, after checking CUDA_VISIBLE_DEVICES says the same."""
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "")
    assert nvidia == env.get("CUDA_VISIBLE_DEVICES", ""), (
        f"NVIDIA_VISIBLE_DEVICES={nvidia!r} but CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}"
    )
    return [uuid for uuid in nvidia.split(",") if uuid]


def pods(api: client.Client, namespace: str, *, selector: str = "") -> list[dict[str, Any]]:
    return list(api.list(client.PODS, namespace=namespace, label_selector=selector).items)


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def wait_running(
    api: client.Client, namespace: str, *, count: int, selector: str = "", timeout: float = 180
) -> list[dict[str, Any]]:
    """Wait until `count` pods (matching `selector`) run in `namespace` with every container started; return them."""

    def running() -> list[dict[str, Any]] | None:
        found = [p for p in pods(api, namespace, selector=selector) if not (p["metadata"].get("deletionTimestamp"))]
        started = [
            p
            for p in found
            if phase(p) == "Running"
            and all(s.get("started") for s in (p.get("status") or {}).get("containerStatuses") or ())
        ]
        return started if len(started) == count and len(found) == count else None

    return controlplane.wait_until(
        running,
        what=f"{count} pods{f' ({selector})' if selector else ''} run in {namespace}: {_summary(api, namespace)}",
        timeout=timeout,
        interval=0.5,
    )


def _summary(api: client.Client, namespace: str) -> str:
    return ", ".join(f"{p['metadata']['name']}={phase(p)}" for p in pods(api, namespace)) or "no pods"


def wait_environment(api: client.Client, namespace: str, pod: str, container: str = "") -> dict[str, str]:
    """The environment the container printed, waiting for it (bounded)."""
    return controlplane.wait_until(
        lambda: environment(api, namespace, pod, container),
        what=f"container {container or '(only)'} of pod {namespace}/{pod} printed its environment",
        timeout=60,
        interval=0.5,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Allocated:
    """One device a claim holds: its request, pool (= node) and device name."""

    request: str
    pool: str
    device: str


def allocated(claim: Mapping[str, Any]) -> list[Allocated]:
    """The devices of `gpu.nvidia.com` in a claim's allocation (empty when unallocated)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    return [Allocated(r["request"], r["pool"], r["device"]) for r in results if r.get("driver") == GPU_DRIVER]


def device_attributes(api: client.Client, pool: str) -> dict[str, dict[str, Any]]:
    """Every device of `pool` (a node) by name, with its attributes as plain values (`{"string": x}` -> x)."""
    found: dict[str, dict[str, Any]] = {}
    for item in api.list(client.RESOURCE_SLICES).items:
        spec = item.get("spec") or {}
        if spec.get("driver") != GPU_DRIVER or (spec.get("pool") or {}).get("name") != pool:
            continue
        for device in spec.get("devices") or ():
            attributes = device.get("attributes") or {}
            found[device["name"]] = {name: next(iter(value.values())) for name, value in attributes.items()}
    return found


def uuids_of(api: client.Client, results: Sequence[Allocated]) -> list[str]:
    """The `uuid` attribute of each allocated device, from its slice."""
    by_pool = {pool: device_attributes(api, pool) for pool in {r.pool for r in results}}
    return [str(by_pool[r.pool][r.device]["uuid"]) for r in results]
