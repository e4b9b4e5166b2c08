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

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import controlplane
import faultproxy
import prometheus_client
import pytest
import yaml
from support import kube_objects, node_group

from dractl.controller import claims as claims_ctl
from dractl.controller import scheduler as sched
from dractl.kube import client, workqueue

pytestmark = pytest.mark.timeout(240)

EXAMPLES = node_group.EXAMPLES
Group = node_group.Group
FINALIZER = node_group.FINALIZER
ONE_GPU = kube_objects.ONE_GPU


def _devices(claim: dict[str, Any]) -> list[tuple[str, str]]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    return sorted((result["pool"], result["device"]) for result in results)


def _reserved(claim: dict[str, Any]) -> list[str]:
    return sorted(entry["uid"] for entry in (claim.get("status") or {}).get("reservedFor") or ())


@pytest.fixture
def group(kube_client: client.Client, namespace: str, scheduler_name: str) -> Iterator[Group]:
    """The test's namespace and node group (nodes and slices removed at the end), with the example DeviceClasses."""
    node_group.ensure_device_classes(kube_client)
    made = Group(kube_client, namespace=namespace, scheduler_name=scheduler_name)
    yield made
    made.cleanup()


@pytest.fixture
def scheduler_name() -> str:
    return f"dractl-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_scheduler(proxied_client: client.Client, scheduler_name: str) -> Iterator[Callable[..., sched.Scheduler]]:
    """Starts schedulers (through the fault proxy, fast backoff unless told) for the test's scheduler name.

    At the end of the test each is stopped (last started first, each even when stopping another failed), before
    the client it uses is closed; `stop()` joins their threads with a timeout.
    """
    with contextlib.ExitStack() as started:

        def make(*, backoff: float = 0.02) -> sched.Scheduler:
            queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=backoff, cap=max(backoff, 0.5)))
            made = sched.Scheduler(
                proxied_client,
                scheduler_name=scheduler_name,
                queue=queue,
                registry=prometheus_client.CollectorRegistry(),
            )
            made.start()
            started.callback(made.stop)
            return made

        yield make


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
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    claim_controller: claims_ctl.ClaimController,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the generated claim gets the finalizer, one T4 of the node and the pod in reservedFor, the pod is
    bound to that node, the metrics count it, and syncing the converged pod again writes nothing."""
    node = group.node("t4-node-01")
    group.template("one-gpu", ONE_GPU)
    pod = group.pod("trainer", claims=[kube_objects.from_template("one-gpu")])
    scheduler = make_scheduler()
    assert group.wait_bound("trainer") == node
    claim = group.pod_claim("trainer")
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

    controlplane.wait_until(
        lambda: scheduler.pods.store.get(f"{group.namespace}/trainer").node_name,
        what="the scheduler's cache sees the bind",
    )
    fault_proxy.clear()
    scheduler.sync_pod(group.namespace, "trainer")
    assert [(r.method, r.target) for r in fault_proxy.writes()] == []


def test_two_mig_slices_of_one_parent_gpu(
    group: Group,
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
    group.template("mig-mixed", template["spec"]["spec"])
    group.pod(
        "mig",
        claims=[kube_objects.from_template("mig-mixed", pod_claim="mig-devices")],
    )
    make_scheduler()
    assert group.wait_bound("mig", timeout=90) == node
    claim = group.pod_claim("mig", "mig-devices")
    results = {r["request"]: r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    assert set(results) == {"large-slice", "small-slice"}
    assert "-mig-3g40gb-" in results["large-slice"] and "-mig-1g10gb-" in results["small-slice"]
    parents = {device.split("-mig-")[0] for device in results.values()}
    assert len(parents) == 1, results


def test_a_four_gpu_nvlink_claim_takes_one_partition(
    kube_client: client.Client,
    group: Group,
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
    group.claim("nvlink", claim_doc["spec"])
    group.pod("train", claims=[kube_objects.of_claim("nvlink", pod_claim="gpus")])
    make_scheduler()
    assert group.wait_bound("train") == node
    claim = group.get_claim("nvlink")
    devices = [device for _, device in _devices(claim)]
    assert len(devices) == 4
    [slice_] = kube_client.list(client.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}").items
    partitions = {d["attributes"]["partition4"]["int"] for d in slice_["spec"]["devices"] if d["name"] in devices}
    assert len(partitions) == 1, devices


def test_a_shared_claim_puts_the_second_pod_on_the_same_node(
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a claim used by two pods is allocated once; the second pod lands on the claim's node (not the other
    node with free GPUs) and reservedFor lists both pods."""
    group.node("t4-node-01")
    group.node("t4-node-01")
    group.claim("shared", ONE_GPU)
    first = group.pod("first", claims=[kube_objects.of_claim("shared")])
    make_scheduler()
    node = group.wait_bound("first")
    second = group.pod("second", claims=[kube_objects.of_claim("shared")])
    assert group.wait_bound("second") == node
    claim = group.get_claim("shared")
    assert len(_devices(claim)) == 1
    assert _reserved(claim) == sorted([first["metadata"]["uid"], second["metadata"]["uid"]])


def test_an_unschedulable_pod_is_told_why_and_scheduled_once_a_slice_appears(
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: with no devices the pod gets PodScheduled=False/Unschedulable naming the nodes and the claim's
    request, one Warning Event FailedScheduling and the unschedulable gauge; a slice added later gets it bound."""
    node = group.node("t4-node-01", slices=False)
    group.claim("wants-gpu", ONE_GPU)
    group.pod("waiting", claims=[kube_objects.of_claim("wants-gpu")])
    scheduler = make_scheduler()
    condition = group.wait_condition("waiting")
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert "nodes are available" in condition["message"] and "cannot allocate all claims" in condition["message"]
    assert f"ResourceClaim {group.namespace}/wants-gpu request gpu" in condition["message"]
    [event] = controlplane.wait_until(
        lambda: group.events("waiting", "FailedScheduling"), what="the Warning Event is recorded"
    )
    assert event["type"] == "Warning" and event["message"] == condition["message"]
    assert scheduler.registry.get_sample_value("dractl_scheduler_unschedulable_pods") == 1

    group.publish("t4-node-01", node)
    assert group.wait_bound("waiting") == node
    claim = group.get_claim("wants-gpu")
    assert len(_devices(claim)) == 1
    condition = group.scheduled_condition("waiting")
    assert condition is not None and condition["status"] == "True"  # The API server sets it on binding.
    controlplane.wait_until(
        lambda: scheduler.registry.get_sample_value("dractl_scheduler_unschedulable_pods") == 0,
        what="the gauge drops to 0",
    )


def test_a_failed_bind_leaves_no_claim_allocated_and_is_retried(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: when the binding POST answers 500 (every retry), the claim's allocation, reservation and the
    finalizer the scheduler added are taken back and the pod stays unbound; once the fault is gone it is bound."""
    node = group.node("t4-node-01")
    group.claim("rollback", ONE_GPU)
    group.pod("unlucky", claims=[kube_objects.of_claim("rollback")])
    fault_proxy.add(faultproxy.respond(500, method="POST", path="/pods/unlucky/binding", count=None))
    scheduler = make_scheduler(backoff=30.0)
    controlplane.wait_until(
        lambda: any(r.fault and "/binding" in r.target for r in fault_proxy.requests),
        what="the proxy refused a binding",
    )
    controlplane.wait_until(
        lambda: scheduler.registry.get_sample_value("dractl_scheduler_attempts_total", {"result": "error"}),
        what="the failed attempt is counted",
    )
    scheduler.stop()
    claim = group.get_claim("rollback")
    assert (claim.get("status") or {}).get("allocation") is None
    assert _reserved(claim) == []
    assert FINALIZER not in (claim["metadata"].get("finalizers") or ())
    assert group.bound("unlucky") == ""
    writes = [(r.method, r.target.split("?")[0].rsplit("/namespaces/", 1)[-1]) for r in fault_proxy.writes()]
    claim_writes = [w for w in writes if "resourceclaims" in w[1]]
    # finalizer, allocation, then (after the refused binding) allocation cleared and finalizer removed
    assert len(claim_writes) == 4, writes

    fault_proxy.clear()
    make_scheduler()
    assert group.wait_bound("unlucky") == node
    claim = group.get_claim("rollback")
    assert len(_devices(claim)) == 1


def test_claims_allocated_before_the_start_are_held(
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a claim already allocated in the API (here gpu-0, by someone else) counts as used from the first
    decision: a pod needing one GPU gets gpu-1, and a pod needing two is unschedulable."""
    node = group.node("t4-node-01")
    group.claim("taken", ONE_GPU)
    group.allocate("taken", node=node, devices=["gpu-0"])
    two = kube_objects.claim_spec(count=2)
    group.claim("one", ONE_GPU)
    group.claim("two", two)
    group.pod("needs-two", claims=[kube_objects.of_claim("two")])
    group.pod("needs-one", claims=[kube_objects.of_claim("one")])
    make_scheduler()
    assert group.wait_bound("needs-one") == node
    assert _devices(group.get_claim("one")) == [(node, "gpu-1")]
    condition = group.wait_condition("needs-two")
    assert condition["reason"] == "Unschedulable"
    assert group.bound("needs-two") == ""


def test_beside_kube_scheduler_its_pods_are_untouched_and_its_claims_count_as_used(
    fault_proxy: faultproxy.FaultProxy,
    upstream: controlplane.Components,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a default-scheduler pod is scheduled by kube-scheduler only (dractl writes nothing about it), and
    the GPU kube-scheduler allocated is not given again: dractl's pod gets the other T4, a second one none."""
    node = group.node("t4-node-01")
    group.claim("upstream", ONE_GPU)
    group.pod("upstream", scheduler="default-scheduler", claims=[kube_objects.of_claim("upstream")])
    scheduler = make_scheduler()
    assert group.wait_bound("upstream", timeout=90) == node
    theirs = _devices(group.get_claim("upstream"))
    assert len(theirs) == 1
    controlplane.wait_until(
        lambda: (claim := scheduler.claims.store.get(f"{group.namespace}/upstream")) is not None and claim.allocation,
        what="the scheduler's cache sees kube-scheduler's allocation",
    )
    group.claim("mine", ONE_GPU)
    group.claim("extra", ONE_GPU)
    group.pod("mine", claims=[kube_objects.of_claim("mine")])
    assert group.wait_bound("mine") == node
    mine = _devices(group.get_claim("mine"))
    assert len(mine) == 1 and mine != theirs
    group.pod("extra", claims=[kube_objects.of_claim("extra")])
    condition = group.wait_condition("extra")
    assert condition["reason"] == "Unschedulable"
    touched = [r.target for r in fault_proxy.writes() if "upstream" in r.target]
    assert touched == []


def test_a_restart_between_the_claim_write_and_the_binding_binds_without_a_second_allocation(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a claim left allocated and reserved for an unbound pod (the scheduler died before binding) pins the
    pod: the new scheduler binds it to that node with the same device and writes nothing to the claim."""
    group.node("t4-node-01")
    second = group.node("t4-node-01")
    group.claim("left", ONE_GPU)
    pod = group.pod("orphan", claims=[kube_objects.of_claim("left")])
    group.allocate("left", node=second, devices=["gpu-1"], pod=pod)
    make_scheduler()
    assert group.wait_bound("orphan") == second
    claim = group.get_claim("left")
    assert _devices(claim) == [(second, "gpu-1")] and _reserved(claim) == [pod["metadata"]["uid"]]
    assert [r.target for r in fault_proxy.writes() if "/resourceclaims/" in r.target] == []


def test_a_burst_on_few_gpus_gives_no_device_twice_and_explains_the_rest(
    proxied_client: client.Client,
    group: Group,
) -> None:
    """Guards: twelve one-GPU pods on three two-GPU nodes, four workers: exactly six are bound, every GPU is given
    once, and the other six are marked Unschedulable."""
    for _ in range(3):
        group.node("t4-node-01")
    for index in range(12):
        group.claim(f"c{index}", ONE_GPU)
        group.pod(f"p{index}", claims=[kube_objects.of_claim(f"c{index}")])
    scheduler = sched.Scheduler(
        proxied_client, scheduler_name=group.scheduler_name, workers=4, registry=prometheus_client.CollectorRegistry()
    )
    scheduler.start()
    try:

        def settled() -> bool:
            pods = [group.get_pod(f"p{index}") for index in range(12)]
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

        controlplane.wait_until(settled, what="six pods are bound and six explained", timeout=90)
    finally:
        scheduler.stop()
    taken = [device for index in range(12) for device in _devices(group.get_claim(f"c{index}"))]
    assert len(taken) == 6 and len(set(taken)) == 6


def test_conflicts_and_broken_watches_lose_no_pod_and_allocate_nothing_twice(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a 409 on the allocation write (retried from fresh state), a 410 on the claim watch and a pod watch
    cut mid-stream still end with every pod bound and each claim allocated once, with one reservation."""
    group.node("t4-node-01")
    for name in ("a", "b"):
        group.claim(name, ONE_GPU)
    fault_proxy.add(
        faultproxy.respond(409, method="PATCH", path="/resourceclaims/a/status"),
        faultproxy.watch_gone(path="/resourceclaims"),
        faultproxy.drop_watch(path="/api/v1/pods", after=1),
    )
    make_scheduler()
    group.pod("a", claims=[kube_objects.of_claim("a")])
    group.pod("b", claims=[kube_objects.of_claim("b")])
    for name in ("a", "b"):
        assert group.wait_bound(name)
    faults = {(r.fault, r.target.split("?")[0].rsplit("/", 1)[-1]) for r in fault_proxy.requests if r.fault}
    assert {("status 409", "status"), ("watch gone", "resourceclaims")} <= faults, faults
    assert any(fault.startswith("drop") for fault, _ in faults), faults
    devices = [_devices(group.get_claim(name)) for name in ("a", "b")]
    assert all(len(found) == 1 for found in devices) and devices[0] != devices[1]
    for name in ("a", "b"):
        claim = group.get_claim(name)
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
    with controlplane.running() as plane, contextlib.ExitStack() as stack:
        api = client.connect(plane.kubeconfig)
        stack.callback(api.close)
        proxy = faultproxy.FaultProxy.start(plane)
        stack.callback(proxy.stop)
        proxied = client.connect(proxy.kubeconfig)
        stack.callback(proxied.close)
        _burst(api, proxied, proxy, pods=pods, nodes=nodes)


def _burst(api: client.Client, proxied: client.Client, proxy: faultproxy.FaultProxy, *, pods: int, nodes: int) -> None:
    import concurrent.futures

    namespace, scheduler_name = "burst", "dractl-burst"
    kube_objects.make_namespace(api, namespace)
    node_group.ensure_device_classes(api)
    group = Group(api, namespace=namespace, scheduler_name=scheduler_name)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: group.node("dgx-h100-01"), range(nodes)))
    group.template("one-gpu", ONE_GPU)

    def start(via: client.Client, stack: contextlib.ExitStack) -> tuple[claims_ctl.ClaimController, sched.Scheduler]:
        """Start a claim controller and a scheduler talking through `via`; `stack` stops them."""
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
        stack.callback(claims.stop)
        scheduler.start()
        stack.callback(scheduler.stop)
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

    # The burst talks to the API server directly (the proxy would add a hop to each of its thousands
    # of requests); the restarted controllers go through the proxy, which counts their writes.
    with contextlib.ExitStack() as running:
        claims, scheduler = start(api, running)
        template = [kube_objects.from_template("one-gpu")]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: group.pod(f"p{i:04d}", claims=template), range(pods)))
        deadline = time.monotonic() + 480
        while counts() != (960, 40):  # A list of 1,000 pods per second, not per 50 ms.
            assert time.monotonic() < deadline, f"timed out waiting for 960 pods bound and 40 explained: {counts()}"
            time.sleep(1.0)

    assert len(api.list(client.PODS, namespace=namespace).items) == pods
    made = api.list(client.RESOURCE_CLAIMS, namespace=namespace).items
    owners = [claim["metadata"]["ownerReferences"][0]["uid"] for claim in made]
    assert len(made) == pods and len(set(owners)) == pods, "one claim per pod, none twice"
    taken = [device for claim in made for device in _devices(claim)]
    assert len(taken) == 960 and len(set(taken)) == 960, "every GPU given once"

    proxy.clear()
    with contextlib.ExitStack() as running:
        claims, scheduler = start(proxied, running)
        controlplane.wait_until(
            lambda: (
                (
                    scheduler.registry.get_sample_value("dractl_scheduler_attempts_total", {"result": "unschedulable"})
                    or 0
                )
                >= 40
                and len(scheduler.queue) == 0
                and len(claims.queue) == 0
            ),
            what="the restarted controllers went over every pod",
            timeout=120,
        )
    assert [(r.method, r.target) for r in proxy.writes()] == []
