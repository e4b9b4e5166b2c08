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
import json
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import controlplane
import node_images
import release
import yaml

from dractl.kube import client
from dractl.model import quantity
from dractl.node import sharing

HERE = pathlib.Path(__file__).resolve().parent
SEEDS = HERE / "manifests" / "seeds"
CLASSES = "00-deviceclasses.yaml"
KUBE_SCHEDULER_SEEDS = ("10-attributes-and-templates.yaml", "11-shared-claims.yaml", "12-mig.yaml")
DRACTL_SEEDS = ("20-nvlink-training.yaml", "21-sharing.yaml", "22-mig-and-versions.yaml")
# Where the chart's node agent keeps its files on a node (--kubelet-plugins-dir/<driver>, --cdi-root).
PLUGIN_DIR = "/var/lib/kubelet/plugins/gpu.nvidia.com"
FAKE_STATE = f"{PLUGIN_DIR}/fake-gpus.json"
CDI_DIR = "/var/run/cdi"
# The namespace the suites install dractl's releases in.
DRACTL_NAMESPACE = release.NAMESPACE
BEGIN, END = "--- environment", "--- end"
# Print the environment once, then wait; SIGTERM ends the loop at once (sh is PID 1 of the container,
# which ignores signals it has no handler for, so the trap matters).
WORKLOAD_SCRIPT = f"echo '{BEGIN}'; env | sort; echo '{END}'; trap 'exit 0' TERM; while :; do sleep 1; done"
GPU_DRIVER = "gpu.nvidia.com"
_T = TypeVar("_T")

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
            "mutatingadmissionpolicies",
            "MutatingAdmissionPolicy",
            namespaced=False,
        ),
        client.Resource(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingadmissionpolicybindings",
            "MutatingAdmissionPolicyBinding",
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
        """A file's text on the node (as a hostPath mount would show it). Raises FileNotFoundError."""
        ...

    def exists(self, node: str, path: str) -> bool:
        """Whether a path exists on the node."""
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


def containers(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The containers (init containers first) of a Pod, or of the pod template of a Deployment, Job or DaemonSet."""
    spec = document.get("spec") or {}
    pod_spec = spec if document.get("kind") == "Pod" else (spec.get("template") or {}).get("spec")
    if pod_spec is None:
        return []
    return [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]


def as_workload(document: Mapping[str, Any], *, image: str, pull_policy: str = "Never") -> dict[str, Any]:
    """The manifest with every container running `image` with the workload script: print the environment, then
    wait. Pure."""
    body = copy.deepcopy(dict(document))
    for container in containers(body):
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

    return wait(
        running,
        what=lambda: (
            f"{count} pods{f' ({selector})' if selector else ''} run in {namespace}: {_summary(api, namespace)}"
        ),
        timeout=timeout,
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
class Device:
    """One device of a slice: its attributes as plain values (`{"string": x}` -> x) and its memory capacity."""

    name: str
    pool: str
    attributes: Mapping[str, Any]
    memory: quantity.Quantity | None

    def has_memory(self, *, more_than: str = "", at_least: str = "") -> bool:
        if self.memory is None:
            return False
        if more_than:
            return self.memory.value > quantity.parse(more_than).value
        return self.memory.value >= quantity.parse(at_least).value


def devices(api: client.Client, pool: str) -> dict[str, Device]:
    """Every device of `pool` (a node's) published for gpu.nvidia.com, by name."""
    found: dict[str, Device] = {}
    for item in api.list(client.RESOURCE_SLICES).items:
        spec = item.get("spec") or {}
        if spec.get("driver") != GPU_DRIVER or (spec.get("pool") or {}).get("name") != pool:
            continue
        for raw in spec.get("devices") or ():
            attributes = {name: next(iter(value.values())) for name, value in (raw.get("attributes") or {}).items()}
            memory = ((raw.get("capacity") or {}).get("memory") or {}).get("value")
            found[raw["name"]] = Device(raw["name"], pool, attributes, quantity.parse(memory) if memory else None)
    return found


def claim_of(api: client.Client, pod: Mapping[str, Any], pod_claim: str) -> dict[str, Any]:
    """The ResourceClaim a pod's `spec.resourceClaims` entry `pod_claim` stands for (named, or made from a template)."""
    namespace = pod["metadata"]["namespace"]
    for entry in pod["spec"].get("resourceClaims") or ():
        if entry["name"] == pod_claim and entry.get("resourceClaimName"):
            return api.get(client.RESOURCE_CLAIMS, entry["resourceClaimName"], namespace=namespace)
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        if status["name"] == pod_claim and status.get("resourceClaimName"):
            return api.get(client.RESOURCE_CLAIMS, status["resourceClaimName"], namespace=namespace)
    raise AssertionError(f"pod {namespace}/{pod['metadata']['name']} records no claim for {pod_claim!r}")


def allocated(api: client.Client, claim: Mapping[str, Any], request: str = "") -> list[Device]:
    """The gpu.nvidia.com devices of a claim's allocation, in result order (of one request when given)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    ours = [r for r in results if r.get("driver") == GPU_DRIVER and (not request or r["request"] == request)]
    assert ours, f"claim {claim['metadata']['name']} is not allocated{f' for request {request}' if request else ''}"
    by_pool = {pool: devices(api, pool) for pool in {r["pool"] for r in ours}}
    return [by_pool[r["pool"]][r["device"]] for r in ours]


def uuids(found: Sequence[Device]) -> list[str]:
    """The GPU UUIDs of whole GPUs (their `uuid` attribute)."""
    return [str(device.attributes["uuid"]) for device in found]


def minor(device: Device) -> int:
    """The GPU minor number of a whole GPU (`gpu-<minor>`) or of a MIG device's parent (`gpu-<minor>-mig-...`)."""
    return int(device.name.split("-")[1])


def fake_state(nodes: Nodes, node: str) -> dict[str, Any]:
    """The fake GPUs' state on `node` (MIG instances, time-slice, compute mode per GPU minor), as the agent keeps it."""
    return dict(json.loads(nodes.read(node, FAKE_STATE)))


# --- dractl's own pods --------------------------------------------------------------------

AGENT_PODS = "app.kubernetes.io/component=node-agent"
CONTROLLER_PODS = "app.kubernetes.io/component=controller"


def image_of(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def ready(pod: Mapping[str, Any]) -> bool:
    """The pod is Ready and not being deleted."""
    conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or ()}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def agents(api: client.Client, namespace: str = DRACTL_NAMESPACE) -> dict[str, dict[str, Any]]:
    """The running node agent pod of each node (any release), by node name."""
    return {
        pod["spec"]["nodeName"]: pod
        for pod in pods(api, namespace, selector=AGENT_PODS)
        if phase(pod) == "Running" and not pod["metadata"].get("deletionTimestamp")
    }


def wait_dractl(
    api: client.Client,
    *,
    nodes: set[str],
    image: str,
    controllers: int,
    namespace: str = DRACTL_NAMESPACE,
    timeout: float = 240,
) -> None:
    """Wait until a node agent pod of `image` runs on each of `nodes` and each node's slices are published, and
    `controllers` controller pods of `image` are Ready."""

    def done() -> bool:
        running = agents(api, namespace)
        if set(running) != nodes or any(image_of(pod) != image for pod in running.values()):
            return False
        if {s["spec"].get("nodeName") for s in api.list(client.RESOURCE_SLICES).items} != nodes:
            return False
        ready_controllers = [
            pod for pod in pods(api, namespace, selector=CONTROLLER_PODS) if image_of(pod) == image and ready(pod)
        ]
        return len(ready_controllers) == controllers

    wait(
        done,
        what=lambda: (
            f"dractl's pods run {image} on {sorted(nodes)} and their slices are published: {_summary(api, namespace)}"
        ),
        timeout=timeout,
        interval=1,
    )


def pod_logs(api: client.Client, namespace: str = DRACTL_NAMESPACE, *, lines: int = 40) -> str:
    """The last lines of every container in `namespace`, and where every pod of the cluster is: a failure report."""
    parts = []
    for pod in pods(api, namespace):
        for container in pod["spec"]["containers"]:
            try:
                text = api.read_log(namespace, pod["metadata"]["name"], container=container["name"])
            except client.ApiError as error:
                text = str(error)
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {pod['metadata']['name']}/{container['name']}:\n{tail}")
    parts.append("--- pods:")
    parts += [
        f"{p['metadata']['namespace']}/{p['metadata']['name']} {phase(p)} on {p['spec'].get('nodeName')}"
        for p in api.list(client.PODS).items
    ]
    return "\n".join(parts)


# --- The seed patterns -------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Wave:
    """Seed manifests applied together in one namespace, and the number of pods they make."""

    api: client.Client
    namespace: str
    files: tuple[str, ...]
    pods: int

    def documents(self) -> list[dict[str, Any]]:
        return [doc for name in self.files for doc in load(SEEDS / name)]

    def apply(self) -> None:
        """Create the namespace (when missing) and apply the manifests into it."""
        apply(self.api, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}])
        apply(self.api, self.documents(), namespace=self.namespace)

    def wait_running(self, *, timeout: float = 300) -> list[dict[str, Any]]:
        return wait_running(self.api, self.namespace, count=self.pods, timeout=timeout)

    def remove(self, *, timeout: float = 180) -> None:
        """Delete the namespace, as a user ends such a test (the API deletes a Job's pods only with a propagation
        policy), and wait until it is gone with every pod and claim in it. Idempotent."""
        remove_namespace(self.api, self.namespace, timeout=timeout)


def remove_namespace(api: client.Client, namespace: str, *, timeout: float = 180) -> None:
    """Delete `namespace` and wait until it is gone, with every pod and claim in it; one already gone is fine."""
    try:
        api.delete(client.NAMESPACES, namespace)
    except client.NotFound:
        return

    def gone() -> bool:
        try:
            api.get(client.NAMESPACES, namespace)
        except client.NotFound:
            return True
        return False

    wait(gone, what=lambda: f"namespace {namespace} is gone: {_summary(api, namespace)}", timeout=timeout)


def wait(predicate: Callable[[], _T], *, what: Callable[[], str], timeout: float, interval: float = 0.5) -> _T:
    """`controlplane.wait_until`, with the failure's clause computed when it fails (the state then, not before)."""
    try:
        return controlplane.wait_until(predicate, what="the condition holds", timeout=timeout, interval=interval)
    except AssertionError:
        raise AssertionError(f"timed out after {timeout:g}s waiting until {what()}") from None


def kube_scheduler_wave(api: client.Client) -> Wave:
    """The seed patterns kube-scheduler places: 9 pods."""
    return Wave(api, "seeds", KUBE_SCHEDULER_SEEDS, pods=9)


def dractl_wave(api: client.Client) -> Wave:
    """The seed patterns dractl's scheduler places (spec.schedulerName: dractl): 7 pods."""
    return Wave(api, "seeds-dractl", DRACTL_SEEDS, pods=7)


def _version(text: object) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def _pod(api: client.Client, namespace: str, name: str) -> dict[str, Any]:
    return api.get(client.PODS, name, namespace=namespace)


def _one_gpu(env: Mapping[str, str], *, where: str) -> str:
    found = visible_devices(env)
    assert len(found) == 1, f"{where} sees {found}, not one device"
    return found[0]


def check_attributes(api: client.Client, namespace: str) -> None:
    """Seed 000 pattern 1: the Job's pod sees the one A100-SXM4-80GB (40Gi or more) its template's claim holds."""
    (pod,) = pods(api, namespace, selector="job-name=finetune-qwen")
    (device,) = allocated(api, claim_of(api, pod, "training-gpu"))
    assert device.attributes["productName"] == "NVIDIA A100-SXM4-80GB" and device.has_memory(at_least="40Gi")
    env = wait_environment(api, namespace, pod["metadata"]["name"], "trainer")
    assert _one_gpu(env, where="the finetune-qwen pod") == device.attributes["uuid"]


def check_template_replicas(api: client.Client, namespace: str) -> None:
    """Seed 001's template: each of the Deployment's 3 replicas sees its own GPU of more than 24000 MB."""
    seen = []
    for pod in pods(api, namespace, selector="app=trainer"):
        (device,) = allocated(api, claim_of(api, pod, "gpu"))
        assert device.has_memory(more_than="24000M"), f"{device.name} has {device.memory}"
        env = wait_environment(api, namespace, pod["metadata"]["name"], "trainer")
        seen.append(_one_gpu(env, where=f"pod {pod['metadata']['name']}"))
        assert seen[-1] == device.attributes["uuid"]
    assert len(seen) == 3 and len(set(seen)) == 3, f"the replicas see {seen}"


def check_shared_claims(api: client.Client, namespace: str) -> None:
    """Named claims: qwen-inference and embedding-service see the one GPU of shared-inference-gpu, reserved for both;
    inference-pod sees shared-gpu-claim's GPU of more than 16000 MB."""
    claim = api.get(client.RESOURCE_CLAIMS, "shared-inference-gpu", namespace=namespace)
    (device,) = allocated(api, claim)
    reserved = sorted(entry["name"] for entry in claim["status"].get("reservedFor") or ())
    assert reserved == ["embedding-service", "qwen-inference"]
    for pod, container in (("qwen-inference", "vllm"), ("embedding-service", "embedder")):
        env = wait_environment(api, namespace, pod, container)
        assert _one_gpu(env, where=f"pod {pod}") == device.attributes["uuid"]
    (memory_device,) = allocated(api, api.get(client.RESOURCE_CLAIMS, "shared-gpu-claim", namespace=namespace))
    assert memory_device.has_memory(more_than="16000M")
    env = wait_environment(api, namespace, "inference-pod", "app")
    assert _one_gpu(env, where="pod inference-pod") == memory_device.attributes["uuid"]


def check_mig_pairs(api: client.Client, namespace: str, nodes: Nodes) -> None:
    """Seed 000 pattern 3: each replica's claim holds a 3g.40gb and a 1g.10gb of one parent GPU, whose two MIG
    instances (GPU instance profiles 9 and 19) the agent created; each model container sees its own MIG device, and
    the monitor, which names no request of the claim, sees both."""
    replicas = pods(api, namespace, selector="app=mig-inference")
    assert len(replicas) == 2
    for pod in replicas:
        claim = claim_of(api, pod, "mig-devices")
        (large,) = allocated(api, claim, "large-slice")
        (small,) = allocated(api, claim, "small-slice")
        assert (large.attributes["profile"], small.attributes["profile"]) == ("3g.40gb", "1g.10gb")
        assert large.attributes["parentUUID"] == small.attributes["parentUUID"] and minor(large) == minor(small)
        state = fake_state(nodes, large.pool)["gpus"][str(minor(large))]
        assert {9, 19} <= {gi["profileId"] for gi in state["gpuInstances"]}, state
        name = pod["metadata"]["name"]
        primary = _one_gpu(wait_environment(api, namespace, name, "primary-model"), where=f"{name}/primary-model")
        helper = _one_gpu(wait_environment(api, namespace, name, "embedding-model"), where=f"{name}/embedding-model")
        assert primary.startswith("MIG-") and helper.startswith("MIG-") and primary != helper
        assert visible_devices(wait_environment(api, namespace, name, "monitor")) == [primary, helper]


def check_kube_scheduler_wave(api: client.Client, nodes: Nodes) -> None:
    """Every pattern of `kube_scheduler_wave`, once its pods run."""
    namespace = kube_scheduler_wave(api).namespace
    check_attributes(api, namespace)
    check_template_replicas(api, namespace)
    check_shared_claims(api, namespace)
    check_mig_pairs(api, namespace, nodes)


def check_nvlink(api: client.Client, namespace: str) -> None:
    """Seed 004: the training pod sees the claim's 4 GPUs, each 40Gi or more, all in one 4-GPU NVLink partition."""
    pod = _pod(api, namespace, "training-job")
    found = allocated(api, claim_of(api, pod, "gpus"))
    assert len(found) == 4 and all(d.has_memory(at_least="40Gi") for d in found)
    assert len({d.attributes["partition4"] for d in found}) == 1, [d.attributes["partition4"] for d in found]
    env = wait_environment(api, namespace, "training-job", "trainer")
    assert visible_devices(env) == uuids(found)


def check_mps(api: client.Client, namespace: str, nodes: Nodes) -> None:
    """MPS (seed 002's shared mode): both pods see the one T4 of mps-gpu and reach its MPS control daemon: the
    daemon's pipe directory exists on the node, and the claim's CDI spec mounts it where CUDA_MPS_PIPE_DIRECTORY
    (set in both containers) says, with the daemon's own shm directory as /dev/shm."""
    claim = api.get(client.RESOURCE_CLAIMS, "mps-gpu", namespace=namespace)
    (device,) = allocated(api, claim)
    assert device.attributes["productName"] == "Tesla T4"
    for pod in ("mps-client-a", "mps-client-b"):
        env = wait_environment(api, namespace, pod, "main")
        assert _one_gpu(env, where=f"pod {pod}") == device.attributes["uuid"]
        assert env.get("CUDA_MPS_PIPE_DIRECTORY") == sharing.MPS_PIPE_IN_CONTAINER
    daemon = sharing.daemon_id(claim["metadata"]["uid"], [str(device.attributes["uuid"])])
    daemon_dir = f"{PLUGIN_DIR}/mps/{daemon}"
    spec_file = f"{CDI_DIR}/k8s.gpu.nvidia.com-claim_{claim['metadata']['uid']}.yaml"
    spec = yaml.safe_load(nodes.read(device.pool, spec_file))
    mounts = {
        m["containerPath"]: m["hostPath"]
        for d in spec["devices"]
        for m in (d.get("containerEdits") or {}).get("mounts") or ()
    }
    # The daemon's pipe directory, and its own shm directory as /dev/shm (never the host's).
    assert mounts == {sharing.MPS_PIPE_IN_CONTAINER: f"{daemon_dir}/pipe", "/dev/shm": f"{daemon_dir}/shm"}, mounts
    assert nodes.exists(device.pool, f"{daemon_dir}/pipe"), f"no MPS pipe directory {daemon_dir}/pipe on {device.pool}"


def check_time_slicing(api: client.Client, namespace: str, nodes: Nodes) -> None:
    """Time-slicing: both pods see the one T4 of timesliced-gpu, whose time-slice the agent set to Long."""
    (device,) = allocated(api, api.get(client.RESOURCE_CLAIMS, "timesliced-gpu", namespace=namespace))
    for pod in ("timesliced-a", "timesliced-b"):
        env = wait_environment(api, namespace, pod, "main")
        assert _one_gpu(env, where=f"pod {pod}") == device.attributes["uuid"]
    state = fake_state(nodes, device.pool)["gpus"][str(minor(device))]
    assert state["timeSlice"] == "LONG", state


def check_mig_instance_and_versions(api: client.Client, namespace: str, nodes: Nodes) -> None:
    """Seed 002's MIG instance: the pod sees one 1g.10gb MIG device, created by the agent. Seed 003: the research
    replica sees 2 GPUs of compute capability 8.0+ and 24 GB+ with a CUDA driver of 12.0 or newer."""
    pod = _pod(api, namespace, "gpu-workload")
    (mig,) = allocated(api, claim_of(api, pod, "gpu"))
    assert mig.attributes["profile"] == "1g.10gb"
    state = fake_state(nodes, mig.pool)["gpus"][str(minor(mig))]
    assert 19 in {gi["profileId"] for gi in state["gpuInstances"]}, state
    assert _one_gpu(wait_environment(api, namespace, "gpu-workload", "training"), where="gpu-workload").startswith(
        "MIG-"
    )
    (research,) = pods(api, namespace, selector="app=research-training")
    found = allocated(api, claim_of(api, research, "research-gpu-claim"))
    assert len(found) == 2 and all(d.has_memory(at_least="24G") for d in found)
    assert all(_version(d.attributes["cudaComputeCapability"]) >= (8, 0, 0) for d in found)
    assert all(_version(d.attributes["cudaDriverVersion"]) >= (12, 0, 0) for d in found)
    env = wait_environment(api, namespace, research["metadata"]["name"], "trainer")
    assert visible_devices(env) == uuids(found)


def check_dractl_wave(api: client.Client, nodes: Nodes) -> None:
    """Every pattern of `dractl_wave`, once its pods run; each pod was placed by dractl."""
    namespace = dractl_wave(api).namespace
    for pod in pods(api, namespace):
        assert pod["spec"]["schedulerName"] == "dractl" and pod["spec"].get("nodeName"), pod["metadata"]["name"]
    check_nvlink(api, namespace)
    check_mps(api, namespace, nodes)
    check_time_slicing(api, namespace, nodes)
    check_mig_instance_and_versions(api, namespace, nodes)


# --- Flows both suites run ----------------------------------------------------------------


def claim_pod(api: client.Client, namespace: str, name: str, *, node: str) -> dict[str, Any]:
    """Create (in a fresh `namespace`, with a one-GPU template) a workload pod on `node` and wait until it runs."""
    apply(api, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER}}]}}},
    }
    apply(api, [template])
    pod = workload_pod(name, namespace=namespace, claims={"gpu": {"resourceClaimTemplateName": "one-gpu"}})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    api.create(client.PODS, pod)

    def running() -> dict[str, Any] | None:
        found = api.get(client.PODS, name, namespace=namespace)
        statuses = (found.get("status") or {}).get("containerStatuses") or ()
        return found if phase(found) == "Running" and all(s.get("started") for s in statuses) else None

    return wait(running, what=lambda: f"pod {namespace}/{name} runs: {_summary(api, namespace)}", timeout=180)


def claim_spec_file(api: client.Client, pod: Mapping[str, Any]) -> str:
    """The CDI spec file name of the pod's claim `gpu`."""
    return f"k8s.gpu.nvidia.com-claim_{claim_of(api, pod, 'gpu')['metadata']['uid']}.yaml"


def mid_run_agent_restart(api: client.Client, nodes: Nodes, *, node: str) -> None:
    """Delete `node`'s node agent pod while a claim's pod runs there: the DaemonSet's new agent runs, the pod keeps
    running with its GPU, a new pod gets a GPU from the new agent, and deleting the first pod unprepares its claim."""
    namespace = "agent-restart"
    before = claim_pod(api, namespace, "before", node=node)
    spec_file = claim_spec_file(api, before)
    assert spec_file in nodes.cdi_files(node)
    old = agents(api)[node]
    api.delete(client.PODS, old["metadata"]["name"], namespace=old["metadata"]["namespace"])
    controlplane.wait_until(
        lambda: node in agents(api) and agents(api)[node]["metadata"]["uid"] != old["metadata"]["uid"],
        what=f"the DaemonSet runs a new node agent on {node}",
        timeout=180,
    )
    after = claim_pod(api, namespace, "after", node=node)
    assert visible_devices(wait_environment(api, namespace, "after")), "the pod started after the restart has no GPU"
    still = api.get(client.PODS, "before", namespace=namespace)
    assert still["metadata"]["uid"] == before["metadata"]["uid"] and phase(still) == "Running"
    assert all(s.get("restartCount", 0) == 0 for s in still["status"]["containerStatuses"])
    api.delete(client.PODS, "before", namespace=namespace)
    controlplane.wait_until(
        lambda: spec_file not in nodes.cdi_files(node),
        what="the new agent unprepared the claim of the pod that ran across the restart",
        timeout=120,
    )
    assert claim_spec_file(api, after) in nodes.cdi_files(node)
    remove_namespace(api, namespace)


def uninstall_and_check(
    api: client.Client, nodes: Nodes, *, kubeconfig: pathlib.Path, node_names: Sequence[str]
) -> None:
    """Delete every workload, uninstall the releases, and check nothing of dractl is left: no pod, no DeviceClass,
    no ResourceSlice (the kubelets remove them once the driver is gone), no ResourceClaim, no CDI spec."""
    for wave in (kube_scheduler_wave(api), dractl_wave(api)):
        wave.remove()
    for leftover in ("agent-restart", "upgrade", "kubelet-restart"):
        remove_namespace(api, leftover)
    controlplane.wait_until(
        lambda: not api.list(client.RESOURCE_CLAIMS).items, what="every ResourceClaim is gone", timeout=180
    )
    for name in reversed(release.RELEASES):
        release.uninstall(kubeconfig, name)
    controlplane.wait_until(lambda: not pods(api, DRACTL_NAMESPACE), what="dractl's pods are gone", timeout=120)
    controlplane.wait_until(
        lambda: not api.list(client.RESOURCE_SLICES).items,
        what="the kubelets removed the nodes' ResourceSlices",
        timeout=180,
    )
    assert {node: nodes.cdi_files(node) for node in node_names} == {node: [] for node in node_names}
    names = {item["metadata"]["name"] for item in api.list(client.DEVICE_CLASSES).items}
    assert not {"gpu.nvidia.com", "mig.nvidia.com"} & names, names
