"""dractl's scheduler placing gangs (PodGroups) against a real kube-apiserver with the PodGroup API of Kubernetes 1.36.

Like `test_scheduler.py`: each test gets its own scheduler name and node group (T4 nodes of two GPUs each, with a
`rack` label set per test), the scheduler talks through the fault proxy, and the tests set up objects with a direct
client. Every pod of a gang claims both GPUs of a node (a claim of its own, named after it), so a gang of N pods
needs N nodes. The scheduler watches the PodGroup APIs the server serves (discovered).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import controlplane
import faultproxy
import prometheus_client
import pytest
from support import crds, kube_objects, node_group

from dractl import model
from dractl.controller import claims as claims_ctl
from dractl.controller import scheduler as sched
from dractl.kube import client, workqueue

pytestmark = pytest.mark.timeout(240)

Group = node_group.Group
TWO_GPUS = kube_objects.claim_spec(count=2)


@pytest.fixture
def make_scheduler(proxied_client: client.Client, scheduler_name: str) -> Iterator[Callable[..., sched.Scheduler]]:
    """Starts schedulers (through the fault proxy, fast backoff) for the test's scheduler name, watching the PodGroup
    APIs the server serves; each is stopped at the end of the test, last started first."""
    with contextlib.ExitStack() as started:

        def make() -> sched.Scheduler:
            queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=0.02, cap=0.5))
            made = sched.Scheduler(
                proxied_client,
                scheduler_name=scheduler_name,
                queue=queue,
                registry=prometheus_client.CollectorRegistry(),
                pod_group_apis=sched.served_pod_group_apis(proxied_client),
            )
            made.start()
            started.callback(made.stop)
            return made

        yield make


def _racks(group: Group, *racks: str) -> list[str]:
    """One T4 node per entry, labelled `rack` with it; the node names in order."""
    names = []
    for rack in racks:
        name = group.node("t4-node-01")
        group.api.patch(client.NODES, name, patch={"metadata": {"labels": {"rack": rack}}})
        names.append(name)
    return names


def _pod_group(group: Group, name: str, *, min_count: int, key: str = "") -> None:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    group.api.create(
        client.POD_GROUPS,
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": group.namespace},
            "spec": spec,
        },
    )


def _member(group: Group, name: str, *, gang: str) -> dict[str, Any]:
    """A claim for both GPUs of a node and a pod of the test's scheduler using it, joining the PodGroup `gang`."""
    group.claim(name, TWO_GPUS)
    body = kube_objects.pod(
        name,
        namespace=group.namespace,
        claims=[kube_objects.of_claim(name)],
        cpu="100m",
        schedulerName=group.scheduler_name,
        nodeSelector={node_group.GROUP_LABEL: group.id},
        tolerations=[group.toleration],
        schedulingGroup={"podGroupName": gang},
    )
    return group.api.create(client.PODS, body)


def _refused_with(group: Group, pods: list[str], prefix: str) -> list[dict[str, Any]]:
    """Each pod's PodScheduled condition once every one says False/Unschedulable with a message starting `prefix`."""

    def conditions() -> list[dict[str, Any]] | None:
        found = [group.scheduled_condition(pod) for pod in pods]
        if all(
            c is not None
            and c["status"] == "False"
            and c["reason"] == "Unschedulable"
            and c["message"].startswith(prefix)
            for c in found
        ):
            return [c for c in found if c is not None]
        return None

    return controlplane.wait_until(conditions, what=f"pods {pods} say: {prefix}")


def test_a_four_pod_gang_where_three_fit_binds_none_then_all_four_in_one_rack_once_a_node_frees(
    group: Group, make_scheduler: Callable[..., sched.Scheduler]
) -> None:
    """Guards: a gang of 4 with topology rack, where rack r1 has room for 3 (its fourth node is taken) and r2 for 1:
    no pod is bound and no claim allocated, each pod says the gang's line (PodScheduled=False, Unschedulable) with a
    FailedScheduling Event; once r1's fourth node frees, all 4 are bound, in r1."""
    assert sched.served_pod_group_apis(group.api) == (model.PodGroupApi.WORKLOAD,)
    r1 = _racks(group, "r1", "r1", "r1", "r1")
    _racks(group, "r2")
    group.claim("blocker", TWO_GPUS)
    group.allocate("blocker", node=r1[3], devices=["gpu-0", "gpu-1"])
    _pod_group(group, "train", min_count=4, key="rack")
    pods = [f"worker-{index}" for index in range(4)]
    for pod in pods:
        _member(group, pod, gang="train")
    make_scheduler()
    line = (
        f"gang {group.namespace}/train (minCount 4, topology rack): no rack fits 4 pods; best r1 fits 3: 1 pod short, "
        "2 GPUs of class gpu.nvidia.com"
    )
    for condition in _refused_with(group, pods, line):
        assert condition["message"] == line
    for pod in pods:
        [event] = controlplane.wait_until(
            lambda pod=pod: group.events(pod, "FailedScheduling"), what=f"pod {pod} has its FailedScheduling Event"
        )
        assert (event["type"], event["message"]) == ("Warning", line)
        assert group.bound(pod) == ""
        assert "allocation" not in (group.get_claim(pod).get("status") or {})

    group.api.delete(client.RESOURCE_CLAIMS, "blocker", namespace=group.namespace)
    nodes = [group.wait_bound(pod) for pod in pods]
    assert sorted(nodes) == sorted(r1)


def test_two_gangs_that_fit_one_at_a_time_end_one_bound_whole_and_the_other_none(
    group: Group, make_scheduler: Callable[..., sched.Scheduler]
) -> None:
    """Guards: two gangs of 2 on room for 2 pods, all pods created before the scheduler starts (its workers take
    them at once): exactly one gang is bound whole, no pod of the other is bound nor holds a device, and its pods
    say why."""
    _racks(group, "r1", "r1")
    _pod_group(group, "a", min_count=2)
    _pod_group(group, "b", min_count=2)
    gangs = {"a": ["a-0", "a-1"], "b": ["b-0", "b-1"]}
    for gang, pods in gangs.items():
        for pod in pods:
            _member(group, pod, gang=gang)
    make_scheduler()

    def settled() -> dict[str, list[str]] | None:
        bound = {gang: [pod for pod in pods if group.bound(pod)] for gang, pods in gangs.items()}
        whole = [gang for gang, pods in bound.items() if len(pods) == 2]
        return bound if whole else None

    bound = controlplane.wait_until(settled, what="one gang is bound whole")
    [winner] = [gang for gang, pods in bound.items() if pods]
    loser = "b" if winner == "a" else "a"
    _refused_with(group, gangs[loser], f"gang {group.namespace}/{loser} (minCount 2): the cluster fits 0 of 2 pods")
    for pod in gangs[loser]:
        assert group.bound(pod) == ""
        assert "allocation" not in (group.get_claim(pod).get("status") or {})


def test_a_member_deleted_and_recreated_goes_back_to_its_gangs_rack(
    group: Group,
    claim_controller: claims_ctl.ClaimController,
    make_scheduler: Callable[..., sched.Scheduler],
) -> None:
    """Guards: a pod that joins a gang already running goes to the gang's rack: a member deleted (its claim freed by
    the claim controller) and created again under a new claim is bound in the gang's rack r2, not on the free node
    of r1 that comes first."""
    [lone] = _racks(group, "r1")
    r2 = _racks(group, "r2", "r2")
    _pod_group(group, "train", min_count=2, key="rack")
    for pod in ("worker-0", "worker-1"):
        _member(group, pod, gang="train")
    make_scheduler()
    assert sorted(group.wait_bound(pod) for pod in ("worker-0", "worker-1")) == sorted(r2)
    freed = group.bound("worker-1")

    # Without a kubelet a bound pod is deleted at once only when it has ended.
    group.api.patch(
        client.PODS, "worker-1", namespace=group.namespace, subresource="status", patch={"status": {"phase": "Failed"}}
    )
    group.api.delete(client.PODS, "worker-1", namespace=group.namespace)
    controlplane.wait_until(
        lambda: "allocation" not in (group.get_claim("worker-1").get("status") or {}),
        what="the claim of the deleted pod is deallocated",
    )
    group.claim("worker-1-again", TWO_GPUS)
    body = kube_objects.pod(
        "worker-1",
        namespace=group.namespace,
        claims=[kube_objects.of_claim("worker-1-again")],
        cpu="100m",
        schedulerName=group.scheduler_name,
        nodeSelector={node_group.GROUP_LABEL: group.id},
        tolerations=[group.toleration],
        schedulingGroup={"podGroupName": "train"},
    )
    controlplane.wait_until(
        lambda: _created(group, body), what="the pod is created again once the old one is gone", timeout=60
    )
    assert group.wait_bound("worker-1") == freed != lone


def _created(group: Group, body: dict[str, Any]) -> bool:
    """Create the pod; False while the old pod of that name is still being deleted."""
    try:
        group.api.create(client.PODS, body)
    except client.AlreadyExists:
        return False
    return True


def test_the_seed_articles_coscheduling_pod_group_works_as_written_once_its_crd_is_installed(
    group: Group, make_scheduler: Callable[..., sched.Scheduler]
) -> None:
    """Guards: with scheduler-plugins' CRD installed, the scheduler discovers and watches it: pods labelled
    scheduling.x-k8s.io/pod-group with a PodGroup of minMember 2 (scheduleTimeoutSeconds 300) on room for one say the
    gang's line and none is bound; a second node gets both bound."""
    with crds.installed(group.api):
        assert sched.served_pod_group_apis(group.api) == (model.PodGroupApi.WORKLOAD, model.PodGroupApi.COSCHEDULING)
        _racks(group, "r1")
        group.api.create(
            client.COSCHEDULING_POD_GROUPS,
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "seed", "namespace": group.namespace},
                "spec": {"minMember": 2, "scheduleTimeoutSeconds": 300},
            },
        )
        pods = ["seed-0", "seed-1"]
        for name in pods:
            group.claim(name, TWO_GPUS)
            body = kube_objects.pod(
                name,
                namespace=group.namespace,
                claims=[kube_objects.of_claim(name)],
                cpu="100m",
                schedulerName=group.scheduler_name,
                nodeSelector={node_group.GROUP_LABEL: group.id},
                tolerations=[group.toleration],
            )
            body["metadata"]["labels"] = {model.POD_GROUP_LABEL: "seed"}
            group.api.create(client.PODS, body)
        make_scheduler()
        line = f"gang {group.namespace}/seed (minCount 2): the cluster fits 1 of 2 pods: 1 pod short"
        _refused_with(group, pods, line)
        assert [group.bound(pod) for pod in pods] == ["", ""]
        _racks(group, "r1")
        assert sorted(group.wait_bound(pod) for pod in pods) == sorted(group.nodes)


@pytest.mark.parametrize("bound_before", [False, True], ids=["no-pod-bound", "one-pod-bound"])
def test_a_gang_its_last_leader_left_half_written_is_finished_by_the_next_one(
    fault_proxy: faultproxy.FaultProxy,
    group: Group,
    make_scheduler: Callable[..., sched.Scheduler],
    bound_before: bool,
) -> None:
    """Guards: what a leader that died in the middle of a gang's commit leaves (two of three pods' claims allocated
    and reserved for them, and maybe the first pod bound) is finished by the next leader: every pod of the gang is
    bound, the written ones on their claims' nodes, with no claim written again; no pod of the gang stays unbound."""
    nodes = _racks(group, "r1", "r1", "r1")
    _pod_group(group, "train", min_count=3, key="rack")
    pods = {name: _member(group, name, gang="train") for name in ("worker-0", "worker-1", "worker-2")}
    for name, node in (("worker-0", nodes[0]), ("worker-1", nodes[1])):
        group.allocate(name, node=node, devices=["gpu-0", "gpu-1"], pod=pods[name])
    if bound_before:
        group.api.create(
            client.PODS,
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "worker-0"},
                "target": {"kind": "Node", "name": nodes[0]},
            },
            namespace=group.namespace,
            name="worker-0",
            subresource="binding",
        )
    make_scheduler()
    assert [group.wait_bound(name) for name in pods] == nodes
    written = [r.target for r in fault_proxy.writes() if "/resourceclaims/" in r.target]
    assert all("/worker-2" in target for target in written), written
