"""dractl's scheduler against a real kube-apiserver (and beside kube-controller-manager and kube-scheduler).

Node agents are replaced by the ResourceSlices `dractl discover` prints for the example nodes
(`dractl/examples/2*.yaml`), renamed per test; nodes are created by the tests. Each test gets
its own scheduler name and its own node group: the nodes carry a label the pods select and a
taint only the test's pods tolerate, so pods of other tests never land on them and the
scheduler under test never schedules another test's pods. The scheduler talks through the
fault proxy, so its writes are counted and faults can be injected; the tests set up objects
with a direct client. Claims are made from templates by dractl's claim controller.
"""

from __future__ import annotations

import pathlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import controlplane
import faultproxy
import prometheus_client
import pytest
import yaml

import dractl
from dractl.controller import claims as claims_ctl
from dractl.controller import scheduler as sched
from dractl.kube import client, workqueue

pytestmark = pytest.mark.timeout(240)

EXAMPLES = pathlib.Path(dractl.__file__).parent / "examples"
GROUP_LABEL = "test.dractl.io/group"
FINALIZER = "resource.kubernetes.io/delete-protection"
ONE_GPU = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}


def _wait(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll `condition` until it returns something truthy (returned), or fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def _ensure_device_classes(api: client.Client) -> None:
    for document in yaml.safe_load_all((EXAMPLES / "00-deviceclasses.yaml").read_text()):
        if document and document["metadata"]["name"] in ("gpu.nvidia.com", "mig.nvidia.com"):
            try:
                api.create(client.DEVICE_CLASSES, document)
            except client.AlreadyExists:
                pass  # Made by an earlier test of the session; cluster-scoped and identical.


class Group:
    """One test's nodes: a unique label and a taint, slices copied from an example node under a new name."""

    def __init__(self, api: client.Client) -> None:
        self.api = api
        self.id = uuid.uuid4().hex[:8]
        self.nodes: list[str] = []

    @property
    def toleration(self) -> dict[str, str]:
        return {"key": GROUP_LABEL, "operator": "Equal", "value": self.id, "effect": "NoSchedule"}

    def node(self, example: str, *, slices: bool = True) -> str:
        """Create a node (Ready, 32 CPUs, 256Gi, 110 pods) named after `example` and, with `slices`, its slices."""
        name = f"{example}-{self.id}-{len(self.nodes)}"
        self.nodes.append(name)
        self.api.create(
            client.NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {GROUP_LABEL: self.id, "kubernetes.io/hostname": name}},
                "spec": {"taints": [{"key": GROUP_LABEL, "value": self.id, "effect": "NoSchedule"}]},
            },
        )
        allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        # A merge patch, not an update: kube-controller-manager (when a coexistence test started it)
        # annotates new nodes, so the version the create returned may already be stale.
        self.api.patch(
            client.NODES,
            name,
            subresource="status",
            patch={
                "status": {
                    "allocatable": allocatable,
                    "capacity": allocatable,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "no kubelet"}],
                }
            },
        )
        if slices:
            self.publish(example, name)
        return name

    def publish(self, example: str, node: str) -> None:
        """Create the example node's slices as node `node` would publish them."""
        [path] = EXAMPLES.glob(f"2*-{example}.yaml")
        for document in yaml.safe_load_all(path.read_text().replace(example, node)):
            if document:
                self.api.create(client.RESOURCE_SLICES, document)

    def pod(
        self, namespace: str, name: str, *, scheduler: str, claims: list[dict[str, str]], cpu: str = "100m"
    ) -> dict[str, Any]:
        return self.api.create(
            client.PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "schedulerName": scheduler,
                    "nodeSelector": {GROUP_LABEL: self.id},
                    "tolerations": [self.toleration],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": cpu}},
                        }
                    ],
                    "resourceClaims": claims,
                },
            },
        )

    def cleanup(self) -> None:
        for name in self.nodes:
            for item in self.api.list(client.RESOURCE_SLICES, field_selector=f"spec.nodeName={name}").items:
                try:
                    self.api.delete(client.RESOURCE_SLICES, item["metadata"]["name"])
                except client.NotFound:
                    pass
            try:
                self.api.delete(client.NODES, name)
            except client.NotFound:
                pass


def _template(api: client.Client, namespace: str, name: str, spec: dict[str, Any]) -> None:
    api.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": spec},
        },
    )


def _claim(api: client.Client, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return api.create(
        client.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        },
    )


def _allocate(
    api: client.Client,
    namespace: str,
    name: str,
    *,
    node: str,
    devices: list[str],
    pod: dict[str, Any] | None = None,
) -> None:
    """Write a claim's allocation on `node` as a scheduler would (with `pod`: the finalizer, and the pod reserved)."""
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device} for device in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            },
        }
    }
    if pod is not None:
        api.patch(client.RESOURCE_CLAIMS, name, namespace=namespace, patch={"metadata": {"finalizers": [FINALIZER]}})
        status["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
    api.patch(client.RESOURCE_CLAIMS, name, namespace=namespace, subresource="status", patch={"status": status})


def _get_pod(api: client.Client, namespace: str, name: str) -> dict[str, Any]:
    return api.get(client.PODS, name, namespace=namespace)


def _bound(api: client.Client, namespace: str, name: str) -> str:
    return str(_get_pod(api, namespace, name)["spec"].get("nodeName") or "")


def _pod_claim(api: client.Client, namespace: str, pod: str, pod_claim: str = "gpu") -> dict[str, Any]:
    """The claim the pod uses for `pod_claim` (direct or recorded)."""
    raw = _get_pod(api, namespace, pod)
    for entry in raw["spec"].get("resourceClaims") or ():
        if entry["name"] == pod_claim and entry.get("resourceClaimName"):
            return api.get(client.RESOURCE_CLAIMS, entry["resourceClaimName"], namespace=namespace)
    for entry in (raw.get("status") or {}).get("resourceClaimStatuses") or ():
        if entry["name"] == pod_claim:
            return api.get(client.RESOURCE_CLAIMS, entry["resourceClaimName"], namespace=namespace)
    raise AssertionError(f"pod {pod} has no claim {pod_claim}")


def _devices(claim: dict[str, Any]) -> list[tuple[str, str]]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    return sorted((result["pool"], result["device"]) for result in results)


def _reserved(claim: dict[str, Any]) -> list[str]:
    return sorted(entry["uid"] for entry in (claim.get("status") or {}).get("reservedFor") or ())


def _scheduled_condition(api: client.Client, namespace: str, pod: str) -> dict[str, Any] | None:
    for condition in (_get_pod(api, namespace, pod).get("status") or {}).get("conditions") or ():
        if condition["type"] == "PodScheduled":
            return dict(condition)
    return None


def _events(api: client.Client, namespace: str, pod: str, reason: str) -> list[dict[str, Any]]:
    return [
        event
        for event in api.list(client.EVENTS, namespace=namespace).items
        if event["involvedObject"].get("name") == pod and event["reason"] == reason
    ]


@pytest.fixture
def group(kube_client: client.Client) -> Iterator[Group]:
    """A node group for one test (nodes and slices removed at the end), with the example DeviceClasses present."""
    _ensure_device_classes(kube_client)
    made = Group(kube_client)
    yield made
    made.cleanup()


@pytest.fixture
def scheduler_name() -> str:
    return f"dractl-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_scheduler(proxied_client: client.Client, scheduler_name: str) -> Iterator[Callable[..., sched.Scheduler]]:
    """Starts schedulers (through the fault proxy, fast backoff unless told) for the test's scheduler name."""
    started: list[sched.Scheduler] = []

    def make(*, backoff: float = 0.02) -> sched.Scheduler:
        queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=backoff, cap=max(backoff, 0.5)))
        made = sched.Scheduler(
            proxied_client, scheduler_name=scheduler_name, queue=queue, registry=prometheus_client.CollectorRegistry()
        )
        made.start()
        started.append(made)
        return made

    yield make
    for made in started:
        made.stop()


@pytest.fixture
def claim_controller(kube_client: client.Client, namespace: str) -> Iterator[claims_ctl.ClaimController]:
    """dractl's claim lifecycle controller on the test namespace (it makes the claims from templates)."""
    queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=0.02, cap=0.5))
    made = claims_ctl.ClaimController(
        kube_client, namespace=namespace, queue=queue, registry=prometheus_client.CollectorRegistry()
    )
    made.start()
    yield made
    made.stop()


def test_a_pod_with_a_template_claim_for_one_gpu_is_allocated_and_bound(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    group: Group,
    scheduler_name: str,
    claim_controller: claims_ctl.ClaimController,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the generated claim gets the finalizer, one T4 of the node and the pod in reservedFor, the pod is
    bound to that node, the metrics count it, and syncing the converged pod again writes nothing."""
    node = group.node("t4-node-01")
    _template(kube_client, namespace, "one-gpu", ONE_GPU)
    pod = group.pod(
        namespace, "trainer", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    )
    scheduler = make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "trainer"), "the pod to be bound") == node
    claim = _pod_claim(kube_client, namespace, "trainer")
    assert FINALIZER in claim["metadata"]["finalizers"]
    [(pool, device)] = _devices(claim)
    assert pool == node and device in ("gpu-0", "gpu-1")
    assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
    assert _reserved(claim) == [pod["metadata"]["uid"]]
    assert scheduler.registry.get_sample_value("dractl_scheduler_attempts_total", {"result": "scheduled"}) == 1
    assert scheduler.registry.get_sample_value("dractl_scheduler_claims_allocated_total") == 1
    assert (
        scheduler.registry.get_sample_value(
            "dractl_scheduler_scheduling_duration_seconds_count", {"result": "scheduled"}
        )
        == 1
    )

    _wait(lambda: scheduler.pods.store.get(f"{namespace}/trainer").node_name, "the scheduler's cache to see the bind")
    fault_proxy.clear()
    scheduler.sync_pod(namespace, "trainer")
    assert [(r.method, r.target) for r in fault_proxy.writes()] == []


def test_two_mig_slices_of_one_parent_gpu(
    kube_client: client.Client,
    namespace: str,
    group: Group,
    scheduler_name: str,
    claim_controller: claims_ctl.ClaimController,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the seed's pattern 3 (a 3g.40gb and a 1g.10gb slice, matchAttribute parentUUID) on a dynamic-MIG
    A100 node: both MIG devices are carved from the same GPU and the pod is bound there."""
    node = group.node("dgx-a100-01")
    [template] = [
        document
        for document in yaml.safe_load_all((EXAMPLES / "32-pattern3-mig.yaml").read_text())
        if document and document["kind"] == "ResourceClaimTemplate"
    ]
    _template(kube_client, namespace, "mig-mixed", template["spec"]["spec"])
    group.pod(
        namespace,
        "mig",
        scheduler=scheduler_name,
        claims=[{"name": "mig-devices", "resourceClaimTemplateName": "mig-mixed"}],
    )
    make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "mig"), "the pod to be bound", timeout=90) == node
    claim = _pod_claim(kube_client, namespace, "mig", "mig-devices")
    results = {r["request"]: r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    assert set(results) == {"large-slice", "small-slice"}
    assert "-mig-3g40gb-" in results["large-slice"] and "-mig-1g10gb-" in results["small-slice"]
    parents = {device.split("-mig-")[0] for device in results.values()}
    assert len(parents) == 1, results


def test_a_four_gpu_nvlink_claim_takes_one_partition(
    kube_client: client.Client,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the 4-GPU claim with matchAttribute partition4 on the H100 node gets four GPUs of one NVLink
    partition, and the pod naming the claim directly is bound to that node."""
    node = group.node("dgx-h100-01")
    [claim_doc] = [
        document
        for document in yaml.safe_load_all((EXAMPLES / "33-nvlink-training.yaml").read_text())
        if document and document["kind"] == "ResourceClaim"
    ]
    _claim(kube_client, namespace, "nvlink", claim_doc["spec"])
    group.pod(namespace, "train", scheduler=scheduler_name, claims=[{"name": "gpus", "resourceClaimName": "nvlink"}])
    make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "train"), "the pod to be bound") == node
    claim = kube_client.get(client.RESOURCE_CLAIMS, "nvlink", namespace=namespace)
    devices = [device for _, device in _devices(claim)]
    assert len(devices) == 4
    [slice_] = kube_client.list(client.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}").items
    partitions = {d["attributes"]["partition4"]["int"] for d in slice_["spec"]["devices"] if d["name"] in devices}
    assert len(partitions) == 1, devices


def test_a_shared_claim_puts_the_second_pod_on_the_same_node(
    kube_client: client.Client,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a claim used by two pods is allocated once; the second pod lands on the claim's node (not the other
    node with free GPUs) and reservedFor lists both pods."""
    group.node("t4-node-01")
    group.node("t4-node-01")
    _claim(kube_client, namespace, "shared", ONE_GPU)
    first = group.pod(
        namespace, "first", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "shared"}]
    )
    make_scheduler()
    node = _wait(lambda: _bound(kube_client, namespace, "first"), "the first pod to be bound")
    second = group.pod(
        namespace, "second", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "shared"}]
    )
    assert _wait(lambda: _bound(kube_client, namespace, "second"), "the second pod to be bound") == node
    claim = kube_client.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
    assert len(_devices(claim)) == 1
    assert _reserved(claim) == sorted([first["metadata"]["uid"], second["metadata"]["uid"]])


def test_an_unschedulable_pod_is_told_why_and_scheduled_once_a_slice_appears(
    kube_client: client.Client,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: with no devices the pod gets PodScheduled=False/Unschedulable naming the nodes and the claim's
    request, one Warning Event FailedScheduling and the unschedulable gauge; a slice added later gets it bound."""
    node = group.node("t4-node-01", slices=False)
    _claim(kube_client, namespace, "wants-gpu", ONE_GPU)
    group.pod(
        namespace, "waiting", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "wants-gpu"}]
    )
    scheduler = make_scheduler()
    condition = _wait(lambda: _scheduled_condition(kube_client, namespace, "waiting"), "the PodScheduled condition")
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert "nodes are available" in condition["message"] and "cannot allocate all claims" in condition["message"]
    assert f"ResourceClaim {namespace}/wants-gpu request gpu" in condition["message"]
    [event] = _wait(lambda: _events(kube_client, namespace, "waiting", "FailedScheduling"), "the Warning Event")
    assert event["type"] == "Warning" and event["message"] == condition["message"]
    assert scheduler.registry.get_sample_value("dractl_scheduler_unschedulable_pods") == 1

    group.publish("t4-node-01", node)
    assert _wait(lambda: _bound(kube_client, namespace, "waiting"), "the pod to be bound after the slice") == node
    claim = kube_client.get(client.RESOURCE_CLAIMS, "wants-gpu", namespace=namespace)
    assert len(_devices(claim)) == 1
    condition = _scheduled_condition(kube_client, namespace, "waiting")
    assert condition is not None and condition["status"] == "True"  # The API server sets it on binding.
    _wait(lambda: scheduler.registry.get_sample_value("dractl_scheduler_unschedulable_pods") == 0, "the gauge to drop")


def test_a_failed_bind_leaves_no_claim_allocated_and_is_retried(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: when the binding POST answers 500 (every retry), the claim's allocation, reservation and the
    finalizer the scheduler added are taken back and the pod stays unbound; once the fault is gone it is bound."""
    node = group.node("t4-node-01")
    _claim(kube_client, namespace, "rollback", ONE_GPU)
    group.pod(namespace, "unlucky", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "rollback"}])
    fault_proxy.add(faultproxy.respond(500, method="POST", path="/pods/unlucky/binding", count=None))
    scheduler = make_scheduler(backoff=30.0)
    _wait(
        lambda: any(r.fault and "/binding" in r.target for r in fault_proxy.requests),
        "a binding refused by the proxy",
    )
    _wait(
        lambda: scheduler.registry.get_sample_value("dractl_scheduler_attempts_total", {"result": "error"}),
        "the failed attempt to be counted",
    )
    scheduler.stop()
    claim = kube_client.get(client.RESOURCE_CLAIMS, "rollback", namespace=namespace)
    assert (claim.get("status") or {}).get("allocation") is None
    assert _reserved(claim) == []
    assert FINALIZER not in (claim["metadata"].get("finalizers") or ())
    assert _bound(kube_client, namespace, "unlucky") == ""
    writes = [(r.method, r.target.split("?")[0].rsplit("/namespaces/", 1)[-1]) for r in fault_proxy.writes()]
    claim_writes = [w for w in writes if "resourceclaims" in w[1]]
    # finalizer, allocation, then (after the refused binding) allocation cleared and finalizer removed
    assert len(claim_writes) == 4, writes

    fault_proxy.clear()
    make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "unlucky"), "the pod to be bound once binding works") == node
    claim = kube_client.get(client.RESOURCE_CLAIMS, "rollback", namespace=namespace)
    assert len(_devices(claim)) == 1


def test_claims_allocated_before_the_start_are_held(
    kube_client: client.Client,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a claim already allocated in the API (here gpu-0, by someone else) counts as used from the first
    decision: a pod needing one GPU gets gpu-1, and a pod needing two is unschedulable."""
    node = group.node("t4-node-01")
    _claim(kube_client, namespace, "taken", ONE_GPU)
    _allocate(kube_client, namespace, "taken", node=node, devices=["gpu-0"])
    two = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}
    _claim(kube_client, namespace, "one", ONE_GPU)
    _claim(kube_client, namespace, "two", two)
    group.pod(namespace, "needs-two", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "two"}])
    group.pod(namespace, "needs-one", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "one"}])
    make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "needs-one"), "the one-GPU pod to be bound") == node
    assert _devices(kube_client.get(client.RESOURCE_CLAIMS, "one", namespace=namespace)) == [(node, "gpu-1")]
    condition = _wait(lambda: _scheduled_condition(kube_client, namespace, "needs-two"), "the two-GPU pod's condition")
    assert condition["reason"] == "Unschedulable"
    assert _bound(kube_client, namespace, "needs-two") == ""


def test_beside_kube_scheduler_its_pods_are_untouched_and_its_claims_count_as_used(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    components: object,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a default-scheduler pod is scheduled by kube-scheduler only (dractl writes nothing about it), and
    the GPU kube-scheduler allocated is not given again: dractl's pod gets the other T4, a second one none."""
    node = group.node("t4-node-01")
    _claim(kube_client, namespace, "upstream", ONE_GPU)
    group.pod(
        namespace, "upstream", scheduler="default-scheduler", claims=[{"name": "gpu", "resourceClaimName": "upstream"}]
    )
    scheduler = make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "upstream"), "kube-scheduler to bind its pod", 90) == node
    upstream = _devices(kube_client.get(client.RESOURCE_CLAIMS, "upstream", namespace=namespace))
    assert len(upstream) == 1
    _wait(
        lambda: (claim := scheduler.claims.store.get(f"{namespace}/upstream")) is not None and claim.allocation,
        "the scheduler's cache to see kube-scheduler's allocation",
    )
    _claim(kube_client, namespace, "mine", ONE_GPU)
    _claim(kube_client, namespace, "extra", ONE_GPU)
    group.pod(namespace, "mine", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "mine"}])
    assert _wait(lambda: _bound(kube_client, namespace, "mine"), "dractl to bind its pod") == node
    mine = _devices(kube_client.get(client.RESOURCE_CLAIMS, "mine", namespace=namespace))
    assert len(mine) == 1 and mine != upstream
    group.pod(namespace, "extra", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "extra"}])
    condition = _wait(lambda: _scheduled_condition(kube_client, namespace, "extra"), "the third pod's condition")
    assert condition["reason"] == "Unschedulable"
    touched = [r.target for r in fault_proxy.writes() if "upstream" in r.target]
    assert touched == []


def test_a_restart_between_the_claim_write_and_the_binding_binds_without_a_second_allocation(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a claim left allocated and reserved for an unbound pod (the scheduler died before binding) pins the
    pod: the new scheduler binds it to that node with the same device and writes nothing to the claim."""
    group.node("t4-node-01")
    second = group.node("t4-node-01")
    _claim(kube_client, namespace, "left", ONE_GPU)
    pod = group.pod(
        namespace, "orphan", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "left"}]
    )
    _allocate(kube_client, namespace, "left", node=second, devices=["gpu-1"], pod=pod)
    make_scheduler()
    assert _wait(lambda: _bound(kube_client, namespace, "orphan"), "the pod to be bound") == second
    claim = kube_client.get(client.RESOURCE_CLAIMS, "left", namespace=namespace)
    assert _devices(claim) == [(second, "gpu-1")] and _reserved(claim) == [pod["metadata"]["uid"]]
    assert [r.target for r in fault_proxy.writes() if "/resourceclaims/" in r.target] == []


def test_a_burst_on_few_gpus_gives_no_device_twice_and_explains_the_rest(
    kube_client: client.Client,
    proxied_client: client.Client,
    namespace: str,
    group: Group,
    scheduler_name: str,
) -> None:
    """Guards: twelve one-GPU pods on three two-GPU nodes, four workers: exactly six are bound, every GPU is given
    once, and the other six are marked Unschedulable."""
    for _ in range(3):
        group.node("t4-node-01")
    for index in range(12):
        _claim(kube_client, namespace, f"c{index}", ONE_GPU)
        group.pod(
            namespace, f"p{index}", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": f"c{index}"}]
        )
    scheduler = sched.Scheduler(
        proxied_client, scheduler_name=scheduler_name, workers=4, registry=prometheus_client.CollectorRegistry()
    )
    scheduler.start()
    try:

        def settled() -> bool:
            pods = [_get_pod(kube_client, namespace, f"p{index}") for index in range(12)]
            bound = [p for p in pods if p["spec"].get("nodeName")]
            refused = [
                p
                for p in pods
                if any(
                    c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                    for c in (p.get("status") or {}).get("conditions") or ()
                )
                and not p["spec"].get("nodeName")
            ]
            return len(bound) == 6 and len(refused) == 6

        _wait(settled, "six pods bound and six explained", timeout=90)
    finally:
        scheduler.stop()
    taken = [
        device
        for index in range(12)
        for device in _devices(kube_client.get(client.RESOURCE_CLAIMS, f"c{index}", namespace=namespace))
    ]
    assert len(taken) == 6 and len(set(taken)) == 6


def test_conflicts_and_broken_watches_lose_no_pod_and_allocate_nothing_twice(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    group: Group,
    scheduler_name: str,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a 409 on the allocation write (retried from fresh state), a 410 on the claim watch and a pod watch
    cut mid-stream still end with every pod bound and each claim allocated once, with one reservation."""
    group.node("t4-node-01")
    for name in ("a", "b"):
        _claim(kube_client, namespace, name, ONE_GPU)
    fault_proxy.add(
        faultproxy.respond(409, method="PATCH", path="/resourceclaims/a/status"),
        faultproxy.watch_gone(path="/resourceclaims"),
        faultproxy.drop_watch(path="/api/v1/pods", after=1),
    )
    make_scheduler()
    group.pod(namespace, "a", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "a"}])
    group.pod(namespace, "b", scheduler=scheduler_name, claims=[{"name": "gpu", "resourceClaimName": "b"}])
    for name in ("a", "b"):
        assert _wait(lambda name=name: _bound(kube_client, namespace, name), f"pod {name} to be bound")
    faults = {(r.fault, r.target.split("?")[0].rsplit("/", 1)[-1]) for r in fault_proxy.requests if r.fault}
    assert {("status 409", "status"), ("watch gone", "resourceclaims")} <= faults, faults
    assert any(fault.startswith("drop") for fault, _ in faults), faults
    devices = [_devices(kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace)) for name in ("a", "b")]
    assert all(len(found) == 1 for found in devices) and devices[0] != devices[1]
    for name in ("a", "b"):
        claim = kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace)
        assert len(_reserved(claim)) == 1


@pytest.mark.timeout(600)
def test_a_burst_of_a_thousand_pods_binds_or_explains_every_one_and_a_resync_writes_nothing(
    control_plane: controlplane.ControlPlane,
) -> None:
    """Guards: 1,000 pods from one template on 120 eight-GPU nodes (960 GPUs), with dractl's claim controller and
    scheduler (4 workers each): every pod gets exactly one claim, 960 are bound with every GPU given once, the
    other 40 are marked Unschedulable, none is lost; restarted controllers over the converged state write nothing.
    On a control plane of its own, so that no kube-controller-manager an earlier test left running takes part."""

    pods, nodes = 1000, 120
    with controlplane.running() as plane:
        api = client.connect(plane.kubeconfig)
        proxy = faultproxy.FaultProxy.start(plane)
        proxied = client.connect(proxy.kubeconfig)
        try:
            _burst(api, proxied, proxy, pods=pods, nodes=nodes)
        finally:
            proxied.close()
            proxy.stop()
            api.close()


ATTEMPTS = "dractl_scheduler_attempts_total"


def _burst(api: client.Client, proxied: client.Client, proxy: faultproxy.FaultProxy, *, pods: int, nodes: int) -> None:
    import concurrent.futures

    namespace, scheduler_name = "burst", "dractl-burst"
    api.create(client.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    service_accounts = client.Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
    api.create(service_accounts, {"metadata": {"name": "default", "namespace": namespace}})
    _ensure_device_classes(api)
    group = Group(api)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: group.node("dgx-h100-01"), range(nodes)))
    _template(api, namespace, "one-gpu", ONE_GPU)

    def start(via: client.Client) -> tuple[claims_ctl.ClaimController, sched.Scheduler]:
        queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=0.02, cap=0.5))
        claims = claims_ctl.ClaimController(
            via, namespace=namespace, queue=queue, workers=4, registry=prometheus_client.CollectorRegistry()
        )
        scheduler = sched.Scheduler(
            via,
            scheduler_name=scheduler_name,
            namespace=namespace,
            workers=4,
            registry=prometheus_client.CollectorRegistry(),
        )
        claims.start()
        scheduler.start()
        return claims, scheduler

    def counts() -> tuple[int, int]:
        items = api.list(client.PODS, namespace=namespace).items
        bound = sum(1 for p in items if p["spec"].get("nodeName"))
        refused = sum(
            1
            for p in items
            if not p["spec"].get("nodeName")
            and any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in (p.get("status") or {}).get("conditions") or ()
            )
        )
        return bound, refused

    # The burst talks to the API server directly (the proxy would add a connection per request);
    # the restarted controllers go through the proxy, which counts their writes.
    claims, scheduler = start(api)
    try:
        template = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda i: group.pod(namespace, f"p{i:04d}", scheduler=scheduler_name, claims=template), range(pods)
                )
            )
        deadline = time.monotonic() + 480
        while counts() != (960, 40):  # A list of 1,000 pods per second, not per 50 ms.
            assert time.monotonic() < deadline, f"timed out waiting for 960 pods bound and 40 explained: {counts()}"
            time.sleep(1.0)
    finally:
        claims.stop()
        scheduler.stop()

    assert len(api.list(client.PODS, namespace=namespace).items) == pods
    made = api.list(client.RESOURCE_CLAIMS, namespace=namespace).items
    owners = [claim["metadata"]["ownerReferences"][0]["uid"] for claim in made]
    assert len(made) == pods and len(set(owners)) == pods, "one claim per pod, none twice"
    taken = [device for claim in made for device in _devices(claim)]
    assert len(taken) == 960 and len(set(taken)) == 960, "every GPU given once"

    proxy.clear()
    claims, scheduler = start(proxied)
    try:
        _wait(
            lambda: (
                (
                    scheduler.registry.get_sample_value("dractl_scheduler_attempts_total", {"result": "unschedulable"})
                    or 0
                )
                >= 40
                and len(scheduler.queue) == 0
                and len(claims.queue) == 0
            ),
            "the restarted controllers to go over every pod",
            timeout=120,
        )
    finally:
        claims.stop()
        scheduler.stop()
    assert [(r.method, r.target) for r in proxy.writes()] == []
