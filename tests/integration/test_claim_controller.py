"""The claim lifecycle controller against a real kube-apiserver (and beside kube-controller-manager).

The controller talks through the fault proxy, so every write it makes is counted and faults can
be injected; the tests set up objects (and play the scheduler) with a direct client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import controlplane
import faultproxy
import pytest
from support import kube_objects

from dractl.controller import claims as controller
from dractl.kube import client
from dractl.model import podclaims

pytestmark = pytest.mark.timeout(180)

ALLOCATION = kube_objects.allocation("node-a", ["gpu-0"])
FINALIZER = controller.DELETE_PROTECTION_FINALIZER
TEMPLATE_CLAIM_METADATA = {"labels": {"team": "ml"}, "annotations": {"note": "from-template"}}


def _template(api: client.Client, namespace: str, name: str = "gpu-template") -> dict[str, Any]:
    return api.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        kube_objects.template(name, namespace=namespace, claim_metadata=TEMPLATE_CLAIM_METADATA),
    )


def _pod(api: client.Client, namespace: str, name: str, claims: list[dict[str, str]], **spec: Any) -> dict[str, Any]:
    return api.create(client.PODS, kube_objects.pod(name, namespace=namespace, claims=claims, **spec))


def _template_pod(api: client.Client, namespace: str, name: str, template: str = "gpu-template") -> dict[str, Any]:
    return _pod(api, namespace, name, [kube_objects.from_template(template)])


def _claims(api: client.Client, namespace: str) -> list[dict[str, Any]]:
    return sorted(api.list(client.RESOURCE_CLAIMS, namespace=namespace).items, key=lambda c: c["metadata"]["name"])


def _recorded(api: client.Client, namespace: str, pod: str) -> dict[str, str]:
    status = api.get(client.PODS, pod, namespace=namespace).get("status") or {}
    return {entry["name"]: entry.get("resourceClaimName", "") for entry in status.get("resourceClaimStatuses") or ()}


def _claim_creates(proxy: faultproxy.FaultProxy) -> list[faultproxy.Request]:
    return [r for r in proxy.writes() if r.method == "POST" and "/resourceclaims" in r.target and r.status == 201]


def _generated(api: client.Client, namespace: str, name: str, pod: dict[str, Any]) -> None:
    annotations = {podclaims.POD_CLAIM_NAME_ANNOTATION: "gpu"}
    api.create(
        client.RESOURCE_CLAIMS, kube_objects.claim(name, namespace=namespace, annotations=annotations, owner=pod)
    )


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
    recorded = controlplane.wait_until(
        lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), what="the pod's status records its claim"
    )
    [claim] = _claims(kube_client, namespace)
    meta = claim["metadata"]
    assert meta["name"] == recorded
    assert meta["name"].startswith("trainer-gpu-") and meta["generateName"] == "trainer-gpu-"
    assert meta["annotations"] == {"note": "from-template", podclaims.POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert meta["labels"] == {"team": "ml"}
    assert meta["ownerReferences"] == [kube_objects.controller_reference(pod)]
    assert claim["spec"] == template["spec"]["spec"]
    assert len(_claim_creates(fault_proxy)) == 1
    assert ctl.registry.get_sample_value("dractl_claim_controller_creates_total", {"status": "success"}) == 1
    assert ctl.registry.get_sample_value("dractl_claim_controller_queue_depth") is not None

    controlplane.wait_until(
        lambda: _cache_current(ctl, namespace, "trainer", recorded), what="the controller's caches caught up"
    )
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
    name = controlplane.wait_until(
        lambda: _recorded(kube_client, namespace, pod_name).get(claim_name), what="the pod's status records its claim"
    )
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
    [created] = controlplane.wait_until(
        lambda: _claims(kube_client, namespace), what="the first controller made a claim"
    )
    controlplane.wait_until(
        lambda: any(r.fault for r in fault_proxy.requests if "/pods/trainer/status" in r.target),
        what="the status write failed",
    )
    first.stop()
    fault_proxy.clear()
    make_controller()
    recorded = controlplane.wait_until(
        lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), what="the pod's status records its claim"
    )
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
    assert (
        controlplane.wait_until(
            lambda: _recorded(kube_client, namespace, "trainer").get("gpu"), what="the pod's status records its claim"
        )
        == "made-elsewhere"
    )
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
    controlplane.wait_until(
        lambda: [c["metadata"]["name"] for c in _claims(kube_client, namespace)] == ["recorded"],
        what="the duplicate is deleted",
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
    controlplane.wait_until(
        lambda: [c["metadata"]["name"] for c in _claims(kube_client, namespace)] == ["trainer-gpu-bbbbb"],
        what="the unrecorded duplicate is deleted",
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

    [event] = controlplane.wait_until(warning, what="the Warning Event is recorded")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "trainer"
    assert f"ResourceClaimTemplate {namespace}/later does not exist" in event["message"]
    assert _claims(kube_client, namespace) == []
    _template(kube_client, namespace, "later")
    assert controlplane.wait_until(
        lambda: _recorded(kube_client, namespace, "trainer").get("gpu"),
        what="the pod's claim exists after the template appeared",
    )


def _create_shared_claim(api: client.Client, namespace: str, *, finalizers: tuple[str, ...]) -> None:
    """Create the claim `shared` with `finalizers` (no status)."""
    api.create(client.RESOURCE_CLAIMS, kube_objects.claim("shared", namespace=namespace, finalizers=finalizers))


def _allocate_shared(api: client.Client, namespace: str, pods: list[dict[str, Any]]) -> None:
    """Allocate the claim `shared` and reserve it for `pods` (no reservedFor when there are none), as a scheduler
    would."""
    status: dict[str, Any] = {"allocation": ALLOCATION}
    if pods:
        status["reservedFor"] = kube_objects.reserved_for(pods)
    api.patch(client.RESOURCE_CLAIMS, "shared", namespace=namespace, subresource="status", patch={"status": status})


def _create_shared_in_use(
    api: client.Client, namespace: str, count: int, *, finalizers: tuple[str, ...] = (FINALIZER,)
) -> list[dict[str, Any]]:
    """The claim `shared` (with `finalizers`, as the scheduler leaves it) allocated for `count` pods `user-<i>`."""
    _create_shared_claim(api, namespace, finalizers=finalizers)
    pods = [_pod(api, namespace, f"user-{i}", [kube_objects.of_claim("shared")]) for i in range(count)]
    _allocate_shared(api, namespace, pods)
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
    _create_shared_in_use(kube_client, namespace, 3)
    make_controller()
    assert _reserved(kube_client, namespace) == ["user-0", "user-1", "user-2"]
    for gone, left in (("user-0", ["user-1", "user-2"]), ("user-1", ["user-2"])):
        kube_client.delete(client.PODS, gone, namespace=namespace)
        controlplane.wait_until(
            lambda left=left: _reserved(kube_client, namespace) == left, what=f"reservedFor is {left}"
        )
        claim = kube_client.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
        assert claim["status"]["allocation"] == ALLOCATION
        assert claim["metadata"]["finalizers"] == [FINALIZER]
    kube_client.delete(client.PODS, "user-2", namespace=namespace)
    controlplane.wait_until(
        lambda: _released(kube_client, namespace), what="the claim is deallocated and its finalizer removed"
    )


def test_a_replaced_pod_loses_its_reservation(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a reservedFor entry whose pod was recreated under the same name (another UID) counts as gone."""
    [old] = _create_shared_in_use(kube_client, namespace, 1)
    kube_client.delete(client.PODS, "user-0", namespace=namespace)
    new = _pod(kube_client, namespace, "user-0", [kube_objects.of_claim("shared")])
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    make_controller()
    controlplane.wait_until(
        lambda: _released(kube_client, namespace), what="the stale reservation is dropped and the claim released"
    )


def test_a_claim_allocated_without_the_finalizer_is_never_deallocated(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a claim allocated by another component (no delete-protection finalizer) keeps its allocation when
    its last pod goes; only the reservation is removed."""
    _create_shared_in_use(kube_client, namespace, 1, finalizers=())
    make_controller()
    kube_client.delete(client.PODS, "user-0", namespace=namespace)
    controlplane.wait_until(lambda: _reserved(kube_client, namespace) == [], what="the reservation is dropped")
    claim = kube_client.get(client.RESOURCE_CLAIMS, "shared", namespace=namespace)
    assert claim["status"]["allocation"] == ALLOCATION


def test_a_finished_pods_generated_claim_is_deleted(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: when the pod of a generated, unreserved claim has Succeeded, the claim is deleted."""
    _template(kube_client, namespace)
    _template_pod(kube_client, namespace, "job")
    make_controller()
    controlplane.wait_until(
        lambda: _recorded(kube_client, namespace, "job").get("gpu"), what="the pod's status records its claim"
    )
    kube_client.patch(
        client.PODS, "job", namespace=namespace, subresource="status", patch={"status": {"phase": "Succeeded"}}
    )
    controlplane.wait_until(lambda: _claims(kube_client, namespace) == [], what="the generated claim is deleted")


def test_a_bound_pod_is_added_to_its_allocated_claims_reservations(
    kube_client: client.Client, namespace: str, make_controller: Callable[[], controller.ClaimController]
) -> None:
    """Guards: a pod already bound to a node whose allocated claim does not list it is added to reservedFor."""
    _create_shared_claim(kube_client, namespace, finalizers=())
    _allocate_shared(kube_client, namespace, [])
    pod = _pod(kube_client, namespace, "bound", [kube_objects.of_claim("shared")], nodeName="node-a")
    make_controller()
    controlplane.wait_until(lambda: _reserved(kube_client, namespace) == ["bound"], what="the bound pod is reserved")
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
    _create_shared_in_use(kube_client, namespace, 2)
    rules = [
        faultproxy.respond(409, method="POST", path=r"/resourceclaims\?", count=1),
        faultproxy.respond(409, method="PATCH", path=r"/pods/[^/]+/status", count=2),
        faultproxy.respond(409, method="PATCH", path=r"/resourceclaims/shared/status", count=2),
        faultproxy.respond(409, method="PUT", path=r"/resourceclaims/shared\?", count=1),
    ]
    fault_proxy.add(*rules)
    for name in ("a", "b"):
        _template_pod(kube_client, namespace, name)
    ctl = make_controller()
    for name in ("user-0", "user-1"):
        kube_client.delete(client.PODS, name, namespace=namespace)
    controlplane.wait_until(lambda: _released(kube_client, namespace), what="the shared claim is released")
    records = {
        name: controlplane.wait_until(
            lambda name=name: _recorded(kube_client, namespace, name).get("gpu"),
            what=f"{name}'s status records its claim",
        )
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


def _settled(api: client.Client, namespace: str, pods: list[str]) -> bool:
    """Every pod records a claim that exists, and no other generated claim exists."""
    records = [_recorded(api, namespace, pod).get("gpu") for pod in pods]
    names = [c["metadata"]["name"] for c in _claims(api, namespace)]
    return all(records) and sorted(names) == sorted(str(r) for r in records)


def _claims_state(api: client.Client, namespace: str, pods: list[str]) -> str:
    """What each pod records and which claims exist (with their owners and deletion marks), for a failure message."""
    records = {pod: _recorded(api, namespace, pod).get("gpu") for pod in pods}
    claims = [
        (
            c["metadata"]["name"],
            [o.get("name") for o in c["metadata"].get("ownerReferences", [])],
            bool(c["metadata"].get("deletionTimestamp")),
        )
        for c in _claims(api, namespace)
    ]
    return f"pods record {records}; claims (name, owners, being deleted) {claims}"


def _made_by(api: client.Client, namespace: str, claim: str) -> list[str]:
    """The managers that wrote claim `claim` (its managedFields)."""
    found = api.get(client.RESOURCE_CLAIMS, claim, namespace=namespace)
    return sorted({entry["manager"] for entry in found["metadata"].get("managedFields") or ()})


def test_beside_kube_controller_managers_claim_controller_it_stops_writing_once_it_sees_it_at_work(
    upstream: controlplane.Components,
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Guards: claims kube-controller-manager recorded before the start are history (nothing written, no stop);
    once it records a claim for a new pod while the controller runs, the controller stops writing for good, says so
    in one warning and the metric; every later pod then gets exactly one claim, kube-controller-manager's, and the
    controller writes nothing for them."""
    _template(kube_client, namespace)
    early = [f"early-{i}" for i in range(3)]
    for name in early:
        _template_pod(kube_client, namespace, name)
    controlplane.wait_until(
        lambda: _settled(kube_client, namespace, early), what="kube-controller-manager made the early claims"
    )
    ctl = make_controller()
    for name in early:
        ctl.sync_pod(namespace, name)
    assert fault_proxy.writes() == [] and ctl.deferring_to is None

    _template_pod(kube_client, namespace, "first")
    controlplane.wait_until(lambda: ctl.deferring_to, what="the controller sees kube-controller-manager at work")
    assert ctl.deferring_to == "ResourceClaimController"
    assert ctl.registry.get_sample_value("dractl_claim_controller_deferring") == 1
    [warning] = [record.getMessage() for record in caplog.records if "stops writing" in record.getMessage()]
    assert f"pod {namespace}/" in warning and "--controllers=*,-resource-claim-controller" in warning
    first = controlplane.wait_until(
        lambda: _recorded(kube_client, namespace, "first").get("gpu"), what="the first pod records a claim"
    )
    assert first in [c["metadata"]["name"] for c in _claims(kube_client, namespace)]

    later = [f"late-{i}" for i in range(4)]
    for name in later:
        _template_pod(kube_client, namespace, name)
    records = {
        name: controlplane.wait_until(
            lambda name=name: _recorded(kube_client, namespace, name).get("gpu"),
            what=f"{name}'s status records its claim",
        )
        for name in later
    }
    for name, claim in records.items():
        owned = [c for c in _claims(kube_client, namespace) if c["metadata"]["ownerReferences"][0]["name"] == name]
        assert [c["metadata"]["name"] for c in owned] == [claim], _claims_state(kube_client, namespace, later)
        assert _made_by(kube_client, namespace, claim) == ["kube-controller-manager"]
    # A request for the first pod that was on its way when the controller stopped may still land; nothing for a
    # later pod may (their claims are checked above: one each, kube-controller-manager's).
    assert [r.target for r in fault_proxy.writes() if any(f"/pods/{name}" in r.target for name in later)] == []
