"""The claim lifecycle controller against a real kube-apiserver (and beside kube-controller-manager).

The controller talks through the fault proxy, so every write it makes is counted and faults can
be injected; the tests set up objects (and play the scheduler) with a direct client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import controlplane
import faultproxy
import prometheus_client
import pytest

from dractl.controller import claims as controller
from dractl.kube import client, workqueue
from dractl.model import podclaims

pytestmark = pytest.mark.timeout(180)

SPEC = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
ALLOCATION = {
    "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}
}


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


def _template(api: client.Client, namespace: str, name: str = "gpu-template") -> dict[str, Any]:
    return api.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"metadata": {"labels": {"team": "ml"}, "annotations": {"note": "from-template"}}, "spec": SPEC},
        },
    )


def _pod(api: client.Client, namespace: str, name: str, claims: list[dict[str, str]]) -> dict[str, Any]:
    return api.create(
        client.PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}], "resourceClaims": claims},
        },
    )


def _template_pod(api: client.Client, namespace: str, name: str, template: str = "gpu-template") -> dict[str, Any]:
    return _pod(api, namespace, name, [{"name": "gpu", "resourceClaimTemplateName": template}])


def _claims(api: client.Client, namespace: str) -> list[dict[str, Any]]:
    return sorted(api.list(client.RESOURCE_CLAIMS, namespace=namespace).items, key=lambda c: c["metadata"]["name"])


def _recorded(api: client.Client, namespace: str, pod: str) -> dict[str, str]:
    status = api.get(client.PODS, pod, namespace=namespace).get("status") or {}
    return {entry["name"]: entry.get("resourceClaimName", "") for entry in status.get("resourceClaimStatuses") or ()}


def _claim_creates(proxy: faultproxy.FaultProxy) -> list[faultproxy.Request]:
    return [r for r in proxy.writes() if r.method == "POST" and "/resourceclaims" in r.target and r.status == 201]


def _generated(api: client.Client, namespace: str, name: str, pod: dict[str, Any]) -> None:
    api.create(
        client.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {podclaims.POD_CLAIM_NAME_ANNOTATION: "gpu"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": SPEC,
        },
    )


@pytest.fixture
def make_controller(
    proxied_client: client.Client, namespace: str
) -> Iterator[Callable[[], controller.ClaimController]]:
    """Starts claim controllers on the test namespace through the fault proxy (fast backoff); stops them at the end."""
    started: list[controller.ClaimController] = []

    def make() -> controller.ClaimController:
        queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=0.02, cap=0.5))
        made = controller.ClaimController(
            proxied_client, namespace=namespace, queue=queue, registry=prometheus_client.CollectorRegistry()
        )
        made.start()
        started.append(made)
        return made

    yield make
    for made in started:
        made.stop()


def _cache_current(ctl: controller.ClaimController, namespace: str, pod: str, claim: str) -> bool:
    cached_pod = ctl.pods.store.get(f"{namespace}/{pod}")
    cached_claim = ctl.claims.store.get(f"{namespace}/{claim}")
    return cached_pod is not None and cached_pod.claim_statuses.get("gpu") == claim and cached_claim is not None


def test_a_template_claim_is_created_recorded_and_a_second_sync_writes_nothing(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: the generated claim's name prefix, annotations, labels, owner reference and spec, its record in the
    pod's status, and that syncing the converged pod and claim again issues zero writes."""
    template = _template(kube_client, namespace)
    pod = _template_pod(kube_client, namespace, "trainer")
    ctl = make_controller()
    recorded = _wait(lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), "the pod status record")
    [claim] = _claims(kube_client, namespace)
    meta = claim["metadata"]
    assert meta["name"] == recorded
    assert meta["name"].startswith("trainer-gpu-") and meta["generateName"] == "trainer-gpu-"
    assert meta["annotations"] == {"note": "from-template", podclaims.POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert meta["labels"] == {"team": "ml"}
    expected_owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer",
        "uid": pod["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    if not _claim_creates(fault_proxy):
        # kube-controller-manager (running when a coexistence test ran earlier in the session) was
        # faster and dractl adopted its claim; 1.36's controller leaves blockOwnerDeletion out.
        del expected_owner["blockOwnerDeletion"]
    assert meta["ownerReferences"] == [expected_owner]
    assert claim["spec"] == template["spec"]["spec"]
    assert len(_claim_creates(fault_proxy)) <= 1
    created = ctl.registry.get_sample_value("dractl_claim_controller_creates_total", {"status": "success"})
    assert created == len(_claim_creates(fault_proxy))
    assert ctl.registry.get_sample_value("dractl_claim_controller_queue_depth") is not None

    _wait(lambda: _cache_current(ctl, namespace, "trainer", recorded), "the controller's caches to catch up")
    fault_proxy.clear()
    ctl.sync_pod(namespace, "trainer")
    ctl.sync_claim(namespace, recorded)
    assert [(r.method, r.target) for r in fault_proxy.writes()] == []


def test_long_names_are_truncated_like_upstream(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a pod and pod claim whose names exceed 57 characters get upstream's proportionally cut generateName."""
    _template(kube_client, namespace)
    pod_name = "p" * 50
    claim_name = "c" * 30
    _pod(kube_client, namespace, pod_name, [{"name": claim_name, "resourceClaimTemplateName": "gpu-template"}])
    make_controller()
    name = _wait(lambda: _recorded(kube_client, namespace, pod_name).get(claim_name), "the pod status record")
    [claim] = _claims(kube_client, namespace)
    assert claim["metadata"]["generateName"] == "p" * 34 + "-" + "c" * 20
    assert name.startswith("p" * 34 + "-" + "c" * 20) and len(name) == 60


def test_a_restart_between_create_and_status_write_adopts_the_claim(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: a controller that created the claim but never wrote the pod status is replaced by one that adopts
    that claim instead of creating a second."""
    _template(kube_client, namespace)
    fault_proxy.add(faultproxy.respond(409, method="PATCH", path=r"/pods/trainer/status", count=None))
    _template_pod(kube_client, namespace, "trainer")
    first = make_controller()
    [created] = _wait(lambda: _claims(kube_client, namespace), "the first controller's claim")
    _wait(
        lambda: any(r.fault for r in fault_proxy.requests if "/pods/trainer/status" in r.target),
        "the status write to fail",
    )
    first.stop()
    fault_proxy.clear()
    make_controller()
    recorded = _wait(lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), "the pod status record")
    assert recorded == created["metadata"]["name"]
    assert [c["metadata"]["name"] for c in _claims(kube_client, namespace)] == [recorded]
    assert _claim_creates(fault_proxy) == []


def test_an_existing_generated_claim_is_adopted(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: a claim already controlled by the pod with the pod-claim-name annotation is recorded, not duplicated."""
    _template(kube_client, namespace)
    pod = _template_pod(kube_client, namespace, "trainer")
    _generated(kube_client, namespace, "made-elsewhere", pod)
    make_controller()
    assert _wait(lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), "the record") == "made-elsewhere"
    assert [c["metadata"]["name"] for c in _claims(kube_client, namespace)] == ["made-elsewhere"]
    assert _claim_creates(fault_proxy) == []


def test_a_duplicate_left_by_a_race_is_deleted_and_the_recorded_claim_kept(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: of two claims made for one pod claim (two controllers raced), the one the pod does not record is
    deleted while nothing reserves it; the recorded one stays and nothing is created."""
    _template(kube_client, namespace)
    pod = _template_pod(kube_client, namespace, "trainer")
    _generated(kube_client, namespace, "recorded", pod)
    _generated(kube_client, namespace, "duplicate", pod)
    kube_client.patch(
        client.PODS,
        "trainer",
        namespace=namespace,
        subresource="status",
        patch={"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "recorded"}]}},
    )
    make_controller()
    _wait(
        lambda: [c["metadata"]["name"] for c in _claims(kube_client, namespace)] == ["recorded"],
        "the duplicate to be deleted",
    )
    assert _recorded(kube_client, namespace, "trainer") == {"gpu": "recorded"}
    assert _claim_creates(fault_proxy) == []


def test_of_two_unrecorded_claims_for_one_pod_claim_one_is_adopted_and_the_other_deleted(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: when both racers created a claim and neither recorded it, the first by name is recorded and then,
    triggered by the pod's new record, the other is deleted."""
    _template(kube_client, namespace)
    pod = _template_pod(kube_client, namespace, "trainer")
    _generated(kube_client, namespace, "trainer-gpu-bbbbb", pod)
    _generated(kube_client, namespace, "trainer-gpu-zzzzz", pod)
    make_controller()
    _wait(
        lambda: [c["metadata"]["name"] for c in _claims(kube_client, namespace)] == ["trainer-gpu-bbbbb"],
        "the unrecorded duplicate to be deleted",
    )
    assert _recorded(kube_client, namespace, "trainer") == {"gpu": "trainer-gpu-bbbbb"}
    assert _claim_creates(fault_proxy) == []


def test_a_missing_template_gets_a_warning_event_and_is_retried(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a pod naming a template that does not exist gets a FailedResourceClaimCreation Warning naming it,
    and its claim is created once the template appears."""
    _template_pod(kube_client, namespace, "trainer", template="later")
    make_controller()

    def warning() -> list[dict[str, Any]]:
        return [
            e
            for e in kube_client.list(client.EVENTS, namespace=namespace).items
            if e["reason"] == controller.FAILED_CREATION
        ]

    [event] = _wait(warning, "the Warning Event")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "trainer"
    assert f"ResourceClaimTemplate {namespace}/later does not exist" in event["message"]
    assert _claims(kube_client, namespace) == []
    _template(kube_client, namespace, "later")
    assert _wait(lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), "the claim after the template")


def _shared_claim(api: client.Client, namespace: str, pods: list[dict[str, Any]]) -> None:
    """Reserve and allocate the claim `shared` for `pods`, as the scheduler would (finalizer first)."""
    api.patch(
        client.RESOURCE_CLAIMS,
        "shared",
        namespace=namespace,
        subresource="status",
        patch={
            "status": {
                "allocation": ALLOCATION,
                "reservedFor": [
                    {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
                ],
            }
        },
    )


def _create_shared(api: client.Client, namespace: str, count: int) -> list[dict[str, Any]]:
    api.create(
        client.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": "shared",
                "namespace": namespace,
                "finalizers": [controller.DELETE_PROTECTION_FINALIZER],
            },
            "spec": SPEC,
        },
    )
    pods = [_pod(api, namespace, f"user-{i}", [{"name": "gpu", "resourceClaimName": "shared"}]) for i in range(count)]
    _shared_claim(api, namespace, pods)
    return pods


def _reserved(api: client.Client, namespace: str) -> list[str]:
    claim = api.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
    return [entry["name"] for entry in (claim.get("status") or {}).get("reservedFor") or ()]


def _released(api: client.Client, namespace: str) -> bool:
    claim = api.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
    status = claim.get("status") or {}
    return not status.get("allocation") and not status.get("reservedFor") and not claim["metadata"].get("finalizers")


def test_a_shared_claim_loses_each_deleted_pod_and_is_deallocated_after_the_last(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: reservedFor entries of deleted pods are removed one by one; when the last goes the allocation is
    cleared and the delete-protection finalizer removed; the claim itself (not generated) stays."""
    _create_shared(kube_client, namespace, 3)
    make_controller()
    assert _reserved(kube_client, namespace) == ["user-0", "user-1", "user-2"]
    for gone, left in (("user-0", ["user-1", "user-2"]), ("user-1", ["user-2"])):
        kube_client.delete(client.PODS, gone, namespace=namespace)
        _wait(lambda left=left: _reserved(kube_client, namespace) == left, f"reservedFor to become {left}")
        claim = kube_client.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
        assert claim["status"]["allocation"] == ALLOCATION
        assert claim["metadata"]["finalizers"] == [controller.DELETE_PROTECTION_FINALIZER]
    kube_client.delete(client.PODS, "user-2", namespace=namespace)
    _wait(lambda: _released(kube_client, namespace), "deallocation and finalizer removal")


def test_a_replaced_pod_loses_its_reservation(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a reservedFor entry whose pod was recreated under the same name (another UID) counts as gone."""
    [old] = _create_shared(kube_client, namespace, 1)
    kube_client.delete(client.PODS, "user-0", namespace=namespace)
    new = _pod(kube_client, namespace, "user-0", [{"name": "gpu", "resourceClaimName": "shared"}])
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    make_controller()
    _wait(lambda: _released(kube_client, namespace), "the stale reservation to be dropped and the claim released")


def test_a_claim_allocated_without_the_finalizer_is_never_deallocated(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a claim allocated by another component (no delete-protection finalizer) keeps its allocation when
    its last pod goes; only the reservation is removed."""
    kube_client.create(
        client.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": namespace},
            "spec": SPEC,
        },
    )
    pod = _pod(kube_client, namespace, "user-0", [{"name": "gpu", "resourceClaimName": "shared"}])
    _shared_claim(kube_client, namespace, [pod])
    make_controller()
    kube_client.delete(client.PODS, "user-0", namespace=namespace)
    _wait(lambda: _reserved(kube_client, namespace) == [], "the reservation to be dropped")
    claim = kube_client.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
    assert claim["status"]["allocation"] == ALLOCATION


def test_a_finished_pods_generated_claim_is_deleted(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: when the pod of a generated, unreserved claim has Succeeded, the claim is deleted."""
    _template(kube_client, namespace)
    _template_pod(kube_client, namespace, "job")
    make_controller()
    _wait(lambda: _recorded(kube_client, namespace, "job").get("gpu"), "the claim")
    kube_client.patch(
        client.PODS, "job", namespace=namespace, subresource="status", patch={"status": {"phase": "Succeeded"}}
    )
    _wait(lambda: _claims(kube_client, namespace) == [], "the generated claim to be deleted")


def test_a_bound_pod_is_added_to_its_allocated_claims_reservations(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a pod already bound to a node whose allocated claim does not list it is added to reservedFor."""
    kube_client.create(
        client.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": namespace},
            "spec": SPEC,
        },
    )
    kube_client.patch(
        client.RESOURCE_CLAIMS,
        "shared",
        namespace=namespace,
        subresource="status",
        patch={"status": {"allocation": ALLOCATION}},
    )
    pod = kube_client.create(
        client.PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bound", "namespace": namespace},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
            },
        },
    )
    make_controller()
    _wait(lambda: _reserved(kube_client, namespace) == ["bound"], "the reservation")
    claim = kube_client.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "bound", "uid": pod["metadata"]["uid"]}]


def test_conflicts_on_every_write_lose_and_duplicate_nothing(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: 409s injected on the claim create, the pod status write, the claim status write and the finalizer
    removal are retried: one claim per pod claim, every record written, the shared claim released."""
    _template(kube_client, namespace)
    _create_shared(kube_client, namespace, 2)
    rules = [
        faultproxy.respond(409, method="POST", path=r"/resourceclaims\?", count=1),
        faultproxy.respond(409, method="PATCH", path=r"/pods/[^/]+/status", count=2),
        faultproxy.respond(409, method="PATCH", path=r"/resourceclaims/shared/status", count=2),
        faultproxy.respond(409, method="PATCH", path=r"/resourceclaims/shared\?", count=1),
    ]
    fault_proxy.add(*rules)
    for name in ("a", "b"):
        _template_pod(kube_client, namespace, name)
    ctl = make_controller()
    for name in ("user-0", "user-1"):
        kube_client.delete(client.PODS, name, namespace=namespace)
    _wait(lambda: _released(kube_client, namespace), "the shared claim to be released")
    records = {
        name: _wait(lambda name=name: _recorded(kube_client, namespace, name).get("gpu"), f"{name}'s record")
        for name in ("a", "b")
    }
    generated = sorted(
        c["metadata"]["name"] for c in _claims(kube_client, namespace) if c["metadata"]["name"] != "shared"
    )
    assert generated == sorted(records.values())
    assert [rule.fired for rule in rules] == [rule.count for rule in rules]
    assert ctl.registry.get_sample_value("dractl_claim_controller_creates_total", {"status": "error"}) == 1
    assert ctl.registry.get_sample_value("dractl_claim_controller_sync_errors_total", {"kind": "pod"}) >= 3
    assert ctl.registry.get_sample_value("dractl_claim_controller_sync_errors_total", {"kind": "claim"}) >= 3


@pytest.fixture
def upstream(control_plane: controlplane.ControlPlane) -> Iterator[controlplane.Components]:
    """kube-controller-manager and kube-scheduler for one test, stopped after it.

    Not the session-wide `components` fixture: that leaves them running for every later test in
    the session, and their garbage collector then deletes objects those tests own (the node
    agent's slices of a re-registered Node, for one).
    """
    try:
        started = control_plane.start_components()
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    try:
        yield started
    finally:
        started.stop()


def _settled(api: client.Client, namespace: str, pods: list[str]) -> bool:
    """Every pod records a claim that exists, and no other generated claim exists."""
    records = [_recorded(api, namespace, pod).get("gpu") for pod in pods]
    names = [c["metadata"]["name"] for c in _claims(api, namespace)]
    return all(records) and sorted(names) == sorted(str(r) for r in records)


def test_beside_kube_controller_manager_claims_are_adopted_and_never_duplicated(
    upstream: controlplane.Components,
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: claims kube-controller-manager made are adopted with no create; when both race on new pods, each pod
    claim ends with exactly one claim, the one its pod records."""
    _template(kube_client, namespace)
    early = [f"early-{i}" for i in range(3)]
    for name in early:
        _template_pod(kube_client, namespace, name)
    _wait(lambda: _settled(kube_client, namespace, early), "kube-controller-manager to make the early claims")
    ctl = make_controller()
    for name in early:
        ctl.sync_pod(namespace, name)
    assert _claim_creates(fault_proxy) == []

    racing = [f"race-{i}" for i in range(6)]
    for name in racing:
        _template_pod(kube_client, namespace, name)
    _wait(lambda: _settled(kube_client, namespace, early + racing), "one claim per pod claim", timeout=90)
