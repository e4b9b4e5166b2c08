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
from dractl.kube import client, finalizers, workqueue

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


def test_a_bound_pod_gets_kube_schedulers_scheduled_event_once(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: once bound, the pod gets one Normal Event `Scheduled` with kube-scheduler's exact message, reported by
    dractl; a sync of the converged pod writes nothing more (no second Event)."""
    node = group.node("t4-node-01")
    group.claim("c", ONE_GPU)
    pod = group.pod("told", claims=[kube_objects.of_claim("c")])
    scheduler = make_scheduler()
    assert group.wait_bound("told") == node
    [event] = controlplane.wait_until(lambda: group.events("told", "Scheduled"), what="the Scheduled Event exists")
    assert event["type"] == "Normal"
    assert event["message"] == f"Successfully assigned {group.namespace}/told to {node}"
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"] and event["involvedObject"]["kind"] == "Pod"
    assert (event["count"], event["reportingComponent"], event["source"]) == (1, "dractl", {"component": "dractl"})
    controlplane.wait_until(
        lambda: scheduler.pods.store.get(f"{group.namespace}/told").node_name,
        what="the scheduler's cache sees the bind",
    )
    fault_proxy.clear()
    scheduler.sync_pod(group.namespace, "told")
    assert [(r.method, r.target) for r in fault_proxy.writes()] == []
    assert len(group.events("told", "Scheduled")) == 1


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


def test_the_pod_says_why_each_attempt_failed_and_a_retry_replaces_it(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the PodScheduled condition and the Warning Events follow the attempts: Unschedulable while no node
    has a GPU; once one has, a refused finalizer write replaces it with SchedulerError naming the step, the claim
    and the error (and an Event saying the same); once writes pass, the pod is bound (PodScheduled True)."""
    node = group.node("t4-node-01", slices=False)
    group.claim("c", ONE_GPU)
    group.pod("told", claims=[kube_objects.of_claim("c")])
    make_scheduler()
    assert group.wait_condition("told")["reason"] == "Unschedulable"
    fault_proxy.add(faultproxy.respond(500, method="PATCH", path=r"/resourceclaims/c\?", count=None))
    group.publish("t4-node-01", node)
    failed = controlplane.wait_until(
        lambda: (
            (found := group.scheduled_condition("told")) is not None and found["reason"] == "SchedulerError" and found
        ),
        what="the condition says why the write failed",
    )
    assert failed["status"] == "False"
    assert failed["message"].startswith(
        f"scheduling on node {node} failed while adding the finalizer to ResourceClaim {group.namespace}/c: 500"
    ), failed["message"]
    messages = [event["message"] for event in group.events("told", "FailedScheduling")]
    assert failed["message"] in messages and any("cannot allocate all claims" in message for message in messages)
    fault_proxy.clear()
    assert group.wait_bound("told") == node
    condition = group.scheduled_condition("told")
    assert condition is not None and condition["status"] == "True"


def test_a_pod_that_records_another_claim_before_its_binding_is_bound_with_that_one(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the issue's lost pods: the scheduler allocated claim a, the pod's record, but before the binding the
    pod records claim b (as when kube-controller-manager records its own claim late): the binding, made at the
    pod's version the decision saw, is refused, the live read then shows b, a is taken back (allocation,
    reservation, finalizer), the pod says why, and the retry binds the pod with b allocated and reserved for it."""
    node = group.node("t4-node-01")
    pod = group.pod("late", claims=[kube_objects.from_template("one-gpu")])
    annotations = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    for name in ("a", "b"):
        kube_client.create(
            client.RESOURCE_CLAIMS,
            kube_objects.claim(name, namespace=group.namespace, annotations=annotations, owner=pod),
        )
    record = {"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "a"}]}}
    kube_client.patch(client.PODS, "late", namespace=group.namespace, subresource="status", patch=record)
    # The scheduler's first binding waits 3 s at the proxy; meanwhile the record changes.
    fault_proxy.add(faultproxy.latency(3.0, method="POST", path=rf"/namespaces/{group.namespace}/pods/late/binding"))
    make_scheduler()
    controlplane.wait_until(lambda: _devices(group.get_claim("a")), what="the scheduler allocated claim a")
    record["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "b"
    kube_client.patch(client.PODS, "late", namespace=group.namespace, subresource="status", patch=record)
    assert group.wait_bound("late") == node
    a, b = group.get_claim("a"), group.get_claim("b")
    assert _devices(a) == [] and _reserved(a) == [] and FINALIZER not in (a["metadata"].get("finalizers") or ())
    assert len(_devices(b)) == 1 and _reserved(b) == [pod["metadata"]["uid"]]
    [told] = [event["message"] for event in group.events("late", "FailedScheduling") if "records b" in event["message"]]
    assert f"pod {group.namespace}/late records b for spec.resourceClaims[gpu] now, not a" in told


@pytest.mark.parametrize(
    ("held", "status_writes"),
    # Held before its finalizer: one status write (the allocation that stays). Held before its allocation: that
    # allocation, its taking back, the allocation that stays.
    [(r"/resourceclaims/mine(\?|$)", 1), (r"/resourceclaims/mine/status", 3)],
    ids=["before-its-finalizer", "before-its-allocation"],
)
def test_a_device_another_scheduler_allocated_first_is_given_back_before_the_binding(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
    held: str,
    status_writes: int,
) -> None:
    """Guards: two schedulers, one device: while dractl's finalizer (or allocation) write is held at the proxy,
    another writer (as kube-scheduler would) allocates the GPU dractl chose to another claim; dractl's claim cache,
    brought up to dractl's own write, shows that allocation written first, so dractl takes its decision back before
    binding (before writing its allocation at all when the other came before its finalizer), says why on the pod,
    and binds the pod with the node's other GPU: no device is given twice."""
    node = group.node("t4-node-01")
    group.claim("theirs", ONE_GPU)
    group.claim("mine", ONE_GPU)
    pod = group.pod("mine", claims=[kube_objects.of_claim("mine")])
    uid = group.get_claim("mine")["metadata"]["uid"]
    fault_proxy.add(faultproxy.latency(5.0, method="PATCH", path=rf"/namespaces/{group.namespace}{held}"))
    scheduler = make_scheduler()
    controlplane.wait_until(lambda: fault_proxy.holding, what="dractl's claim write is held at the proxy")
    decided = scheduler.allocator.held(uid)
    assert decided is not None
    [device] = [result.device for result in decided.results]
    group.allocate("theirs", node=node, devices=[device])  # Written before dractl's, which the proxy still holds.
    assert group.wait_bound("mine") == node
    mine, theirs = group.get_claim("mine"), group.get_claim("theirs")
    assert _devices(theirs) == [(node, device)]
    assert len(_devices(mine)) == 1 and _devices(mine) != _devices(theirs), "one device given to two claims"
    assert _reserved(mine) == [pod["metadata"]["uid"]]
    conflict = (
        f"ResourceClaim {group.namespace}/mine: device gpu.nvidia.com/{node}/{device} is allocated to ResourceClaim "
        f"{group.namespace}/theirs too"
    )
    assert any(conflict in event["message"] for event in group.events("mine", "FailedScheduling"))
    assert scheduler.registry.get_sample_value("dractl_scheduler_contested_total") == 1
    written = [r for r in fault_proxy.writes() if r.method == "PATCH" and "/resourceclaims/mine/status" in r.target]
    assert len(written) == status_writes, written


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


def test_where_kube_controller_manager_makes_no_claims_dractls_claim_controller_does_it_all(
    upstream_without_claims: controlplane.Components,
    kube_client: client.Client,
    group: Group,
    claim_controller: claims_ctl.ClaimController,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the `claims,scheduler` set-up (kube-controller-manager with --controllers=*,-resource-claim-controller):
    dractl's claim controller makes and records the claims of the pods of both schedulers and never stops writing;
    kube-scheduler binds its pod and dractl its own, each claim allocated and reserved for its pod; once the pods
    have finished, their claims are deallocated, unprotected and deleted. (A node per scheduler: two schedulers
    deciding in the same instant on one node can pick the same device, see README.)"""
    nodes = {"theirs": group.node("t4-node-01"), "mine": group.node("t4-node-01")}
    group.template("one-gpu", ONE_GPU)
    template = [kube_objects.from_template("one-gpu")]
    pods = {
        "theirs": group.pod("theirs", scheduler="default-scheduler", claims=template, node=nodes["theirs"]),
        "mine": group.pod("mine", claims=template, node=nodes["mine"]),
    }
    make_scheduler()
    for name, pod in pods.items():
        assert group.wait_bound(name, timeout=90) == nodes[name]
        claim = group.pod_claim(name)
        assert _reserved(claim) == [pod["metadata"]["uid"]] and len(_devices(claim)) == 1
        assert {entry["manager"] for entry in claim["metadata"]["managedFields"]} >= {"dractl"}
    assert claim_controller.deferring_to is None
    for name in pods:
        kube_client.patch(
            client.PODS, name, namespace=group.namespace, subresource="status", patch={"status": {"phase": "Succeeded"}}
        )
    controlplane.wait_until(
        lambda: not kube_client.list(client.RESOURCE_CLAIMS, namespace=group.namespace).items,
        what="the finished pods' claims are deallocated and deleted",
    )


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


# --- Claims of every shape: allocated, bound, their spec left byte for byte as stored ------------------

T4 = 'device.attributes["gpu.nvidia.com"].productName == "Tesla T4"'
TAINT_KEY = "test.dractl.io/maintenance"
TIME_SLICING = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}
MPS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
}
SELECTOR_FORMS = [
    T4,  # string attribute
    'device.attributes["gpu.nvidia.com"].productName.startsWith("Tesla")',  # string extension
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("8Gi")) >= 0',  # quantity
    'device.attributes["gpu.nvidia.com"].cudaComputeCapability.isGreaterThan(semver("7.0.0"))',  # version
    'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',  # another domain
    '"uuid" in device.attributes["gpu.nvidia.com"]',  # presence
    'device.attributes["gpu.nvidia.com"].?numaNode.orValue(0) == 0',  # optional
    'cel.bind(mem, device.capacity["gpu.nvidia.com"].memory, mem.isGreaterThan(quantity("1Gi")))',  # cel.bind
    'device.driver == "gpu.nvidia.com"',  # the driver
]


def _selectors(*expressions: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": expression}} for expression in expressions]


def _gpu(name: str, *, product: str, memory: str, numa: int = 0, **extra: Any) -> dict[str, Any]:
    """One device of the features slice: a GPU of `product` with `memory`; `extra` adds device fields."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": product},
            "uuid": {"string": f"GPU-{name}"},
            "cudaComputeCapability": {"version": "7.5.0"},
            "numaNode": {"int": numa},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": memory}},
        **extra,
    }


def _features_slice(node: str) -> dict[str, Any]:
    """A slice with two T4s, a tainted A10 and an L4 several claims may share (consumable memory)."""
    shared = _gpu("shared-0", product="NVIDIA L4", memory="24Gi", allowMultipleAllocations=True)
    shared["capacity"]["memory"]["requestPolicy"] = {"default": "4Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
    devices = [
        _gpu("gpu-0", product="Tesla T4", memory="16Gi"),
        _gpu("gpu-1", product="Tesla T4", memory="16Gi"),
        _gpu("gpu-2", product="NVIDIA A10", memory="24Gi", taints=[{"key": TAINT_KEY, "effect": "NoSchedule"}]),
        shared,
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-features"},
        "spec": {
            "driver": kube_objects.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _request(name: str = "gpu", *, device_class: str = "gpu.nvidia.com", **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **exactly}}


def _config(parameters: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": kube_objects.DRIVER, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def _feature_cases(mps_class: str) -> dict[str, dict[str, Any]]:
    """Claim specs by case name: one shape of the API each."""
    return {
        "opaque-config-time-slicing": {
            "devices": {"requests": [_request(selectors=_selectors(T4))], "config": [_config(TIME_SLICING, ["gpu"])]}
        },
        "opaque-config-mps": {"devices": {"requests": [_request(selectors=_selectors(T4))], "config": [_config(MPS)]}},
        "opaque-config-of-the-class": {"devices": {"requests": [_request(device_class=mps_class)]}},
        "every-selector-form": {"devices": {"requests": [_request(selectors=_selectors(*SELECTOR_FORMS))]}},
        "first-available": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "eight", "deviceClassName": "gpu.nvidia.com", "count": 8},
                            {"name": "one", "deviceClassName": "gpu.nvidia.com", "selectors": _selectors(T4)},
                        ],
                    }
                ]
            }
        },
        "allocation-mode-all": {"devices": {"requests": [_request(allocationMode="All", selectors=_selectors(T4))]}},
        "admin-access": {"devices": {"requests": [_request(adminAccess=True, selectors=_selectors(T4))]}},
        "tolerations": {
            "devices": {
                "requests": [
                    _request(
                        selectors=_selectors('device.attributes["gpu.nvidia.com"].productName == "NVIDIA A10"'),
                        tolerations=[{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                    )
                ]
            }
        },
        "capacity-request": {
            "devices": {
                "requests": [
                    _request(
                        selectors=_selectors('device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'),
                        capacity={"requests": {"memory": "8Gi"}},
                    )
                ]
            }
        },
        "constraints": {
            "devices": {
                "requests": [_request("a", selectors=_selectors(T4)), _request("b", selectors=_selectors(T4))],
                "constraints": [
                    {"requests": ["a", "b"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
                    {"requests": ["a", "b"], "distinctAttribute": "gpu.nvidia.com/uuid"},
                ],
            }
        },
    }


def _spec_bytes(api: client.Client, namespace: str, name: str) -> bytes:
    """The claim's spec exactly as the API server stores it."""
    return finalizers.read(api.get_protobuf(client.RESOURCE_CLAIMS, name, namespace=namespace)).sections[2]


def _config_sources(claim: dict[str, Any]) -> list[tuple[str, str]]:
    entries = claim["status"]["allocation"]["devices"].get("config") or ()
    return [(entry["source"], entry["opaque"]["parameters"]["sharing"]["strategy"]) for entry in entries]


def test_claims_of_every_shape_are_allocated_and_bound_with_their_spec_unchanged_byte_for_byte(
    kube_client: client.Client,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: claims with opaque config (TimeSlicing and MPS in the claim, MPS in the class), every CEL selector
    form, firstAvailable, allocationMode All, adminAccess, tolerations of a device taint, a capacity request and
    constraints are each allocated as asked, reserved for their pod (with the finalizer), the pod is bound, and the
    claim's spec is the same bytes as stored before (opaque parameters the Python client sent with spaces, which a
    JSON write re-encodes: the API server then refuses it as a change of the immutable spec)."""
    admin = {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
    kube_client.patch(client.NAMESPACES, group.namespace, patch=admin)
    mps_class = f"gpu-mps-{group.id}"
    kube_client.create(
        client.DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": mps_class},
            "spec": {
                "selectors": _selectors('device.attributes["gpu.nvidia.com"].type == "gpu"', T4),
                "config": [_config(MPS)],
            },
        },
    )
    try:
        cases = _feature_cases(mps_class)
        stored: dict[str, bytes] = {}
        created: dict[str, dict[str, Any]] = {}
        pods: dict[str, dict[str, Any]] = {}
        nodes: dict[str, str] = {}
        for case, spec in cases.items():
            nodes[case] = group.node("t4-node-01", slices=False)
            kube_client.create(client.RESOURCE_SLICES, _features_slice(nodes[case]))
            created[case] = group.claim(case, spec)["spec"]
            stored[case] = _spec_bytes(kube_client, group.namespace, case)
            pods[case] = group.pod(case, claims=[kube_objects.of_claim(case)], node=nodes[case])
        make_scheduler()
        for case in cases:
            try:
                assert group.wait_bound(case) == nodes[case], case
            except AssertionError as error:
                raise AssertionError(f"{error}; PodScheduled: {group.scheduled_condition(case)}") from error
            claim = group.get_claim(case)
            assert _spec_bytes(kube_client, group.namespace, case) == stored[case], case
            assert claim["spec"] == created[case], case
            assert _reserved(claim) == [pods[case]["metadata"]["uid"]], case
            assert FINALIZER in claim["metadata"]["finalizers"], case
        results = {case: group.get_claim(case)["status"]["allocation"]["devices"]["results"] for case in cases}
        assert _config_sources(group.get_claim("opaque-config-time-slicing")) == [("FromClaim", "TimeSlicing")]
        assert _config_sources(group.get_claim("opaque-config-mps")) == [("FromClaim", "MPS")]
        assert _config_sources(group.get_claim("opaque-config-of-the-class")) == [("FromClass", "MPS")]
        assert [r["device"] for r in results["every-selector-form"]] in (["gpu-0"], ["gpu-1"])
        assert [r["request"] for r in results["first-available"]] == ["gpu/one"]
        assert sorted(r["device"] for r in results["allocation-mode-all"]) == ["gpu-0", "gpu-1"]
        assert [r.get("adminAccess") for r in results["admin-access"]] == [True]
        [tolerated] = results["tolerations"]
        assert tolerated["device"] == "gpu-2" and tolerated["tolerations"][0]["key"] == TAINT_KEY
        [share] = results["capacity-request"]
        assert share["device"] == "shared-0" and share["consumedCapacity"] == {"memory": "8Gi"} and share["shareID"]
        assert sorted(r["device"] for r in results["constraints"]) == ["gpu-0", "gpu-1"]
    finally:
        kube_client.delete(client.DEVICE_CLASSES, mps_class)


def test_a_template_claim_with_opaque_config_made_by_dractl_is_allocated_and_bound(
    group: Group,
    claim_controller: claims_ctl.ClaimController,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: the issue's case: the claim dractl's claim controller makes from a template with a GpuConfig
    (the seed's time-slicing pattern) is allocated with the claim's config and the pod bound; the claim's spec is
    the template's."""
    node = group.node("t4-node-01")
    spec = {"devices": {"requests": [_request()], "config": [_config(TIME_SLICING, ["gpu"])]}}
    group.template("time-sliced", spec)
    group.pod("sliced", claims=[kube_objects.from_template("time-sliced")])
    make_scheduler()
    assert group.wait_bound("sliced") == node
    claim = group.pod_claim("sliced")
    template = group.api.get(client.RESOURCE_CLAIM_TEMPLATES, "time-sliced", namespace=group.namespace)
    assert claim["spec"] == template["spec"]["spec"]
    assert _config_sources(claim) == [("FromClaim", "TimeSlicing")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("pods", "nodes"), [(400, 45), pytest.param(1000, 120, marks=pytest.mark.long)], ids=["400-pods", "1000-pods"]
)
def test_a_burst_binds_or_explains_every_pod_and_a_resync_writes_nothing(
    control_plane: controlplane.ControlPlane, pods: int, nodes: int
) -> None:
    """Guards: pods from one template on eight-GPU nodes with 40 GPUs too few (400 pods on 45 nodes by default;
    1,000 on 120 with `-m long`), with dractl's claim controller and scheduler (4 workers each): every pod gets
    exactly one claim, as many are bound as there are GPUs with every GPU given once, the other 40 are marked
    Unschedulable, none is lost; restarted controllers over the converged state write nothing. On a control
    plane of its own, so that no kube-controller-manager an earlier test left running takes part."""

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
        gpus = nodes * 8
        deadline = time.monotonic() + 480
        while counts() != (gpus, pods - gpus):  # A list of every pod per second, not per 50 ms.
            assert time.monotonic() < deadline, f"timed out: {gpus} pods bound, the rest explained? {counts()}"
            time.sleep(1.0)

    assert len(api.list(client.PODS, namespace=namespace).items) == pods
    made = api.list(client.RESOURCE_CLAIMS, namespace=namespace).items
    owners = [claim["metadata"]["ownerReferences"][0]["uid"] for claim in made]
    assert len(made) == pods and len(set(owners)) == pods, "one claim per pod, none twice"
    taken = [device for claim in made for device in _devices(claim)]
    assert len(taken) == gpus and len(set(taken)) == gpus, "every GPU given once"

    proxy.clear()
    with contextlib.ExitStack() as running:
        claims, scheduler = start(proxied, running)
        controlplane.wait_until(
            lambda: (
                (
                    scheduler.registry.get_sample_value("dractl_scheduler_attempts_total", {"result": "unschedulable"})
                    or 0
                )
                >= pods - gpus
                and len(scheduler.queue) == 0
                and len(claims.queue) == 0
            ),
            what="the restarted controllers went over every pod",
            timeout=120,
        )
    assert [(r.method, r.target) for r in proxy.writes()] == []


@pytest.mark.timeout(600)
def test_a_mixed_burst_beside_kube_controller_manager_binds_every_pod_to_the_claims_it_records() -> None:
    """Guards: the default install (dractl's scheduler only) beside kube-controller-manager (which makes the claims)
    and kube-scheduler: 300 pods from one template, every other one for dractl, created at once: every pod is bound,
    the claim each records is the one allocated and reserved for it, one claim per pod, no device twice; once the
    pods are gone, no claim is left. Each scheduler has its own nodes (two schedulers deciding in the same instant
    on one node can pick the same device). On a control plane of its own, with kube's clients at raised limits."""
    pods, nodes = 300, 20
    with controlplane.running() as plane, contextlib.ExitStack() as stack:
        components = plane.start_components(api_qps=500)
        stack.callback(components.stop)
        api = client.connect(plane.kubeconfig)
        stack.callback(api.close)
        _mixed_burst(api, pods=pods, nodes=nodes)


def _mixed_burst(api: client.Client, *, pods: int, nodes: int) -> None:
    import concurrent.futures

    namespace = "mixed"
    kube_objects.make_namespace(api, namespace)
    node_group.ensure_device_classes(api)
    groups = {
        name: Group(api, namespace=namespace, scheduler_name=name) for name in ("default-scheduler", "dractl-mixed")
    }
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: groups[list(groups)[i % 2]].node("dgx-h100-01"), range(2 * nodes)))
    groups["dractl-mixed"].template("one-gpu", ONE_GPU)
    template = [kube_objects.from_template("one-gpu")]
    scheduler = sched.Scheduler(
        api, scheduler_name="dractl-mixed", workers=4, registry=prometheus_client.CollectorRegistry()
    )
    scheduler.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            created = list(
                pool.map(lambda i: groups[list(groups)[i % 2]].pod(f"p{i:04d}", claims=template), range(pods))
            )

        def unbound() -> list[str]:
            items = api.list(client.PODS, namespace=namespace).items
            return [p["metadata"]["name"] for p in items if not p["spec"].get("nodeName")]

        deadline = time.monotonic() + 300
        while left := unbound():  # A list of 300 pods per second, not per 50 ms.
            assert time.monotonic() < deadline, f"timed out waiting for every pod to be bound: {len(left)} unbound"
            time.sleep(1.0)
    finally:
        scheduler.stop()

    claims = {c["metadata"]["name"]: c for c in api.list(client.RESOURCE_CLAIMS, namespace=namespace).items}
    assert len(claims) == pods, f"{len(claims)} claims for {pods} pods"
    taken: list[tuple[str, str]] = []
    for pod in api.list(client.PODS, namespace=namespace).items:
        [record] = pod["status"]["resourceClaimStatuses"]
        claim = claims[record["resourceClaimName"]]
        assert _reserved(claim) == [pod["metadata"]["uid"]], (pod["metadata"]["name"], claim["metadata"]["name"])
        assert len(_devices(claim)) == 1, claim["metadata"]["name"]
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        taken += _devices(claim)
    assert len(set(taken)) == pods, "no device twice"

    def finish_and_delete(pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        api.patch(
            client.PODS, name, namespace=namespace, subresource="status", patch={"status": {"phase": "Succeeded"}}
        )
        api.delete(client.PODS, name, namespace=namespace)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(finish_and_delete, created))
    controlplane.wait_until(
        lambda: not api.list(client.RESOURCE_CLAIMS, namespace=namespace).items,
        what="no claim is left once the pods are gone",
        timeout=180,
    )
