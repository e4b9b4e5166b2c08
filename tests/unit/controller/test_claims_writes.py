"""The exact API writes of one claim-controller sync, over a stub client (paths the real API server cannot
produce: a stored template the model refuses, a claim with 256 reservations)."""

from __future__ import annotations

import copy
from typing import Any

import prometheus_client
import pytest
from support import controller_inputs as build
from support import kube_objects

from dractl.controller import claims as controller
from dractl.kube import client, finalizers


class StubClient:
    """Answers reads from fixed objects and records every write as (method, plural, name or body). A claim's
    protobuf form (for the finalizer write) has its UID, the version its last write gave and the delete-protection
    finalizer."""

    def __init__(
        self, *, templates: dict[str, dict[str, Any]] | None = None, pods: dict[str, dict[str, Any]] | None = None
    ) -> None:
        self.templates = templates or {}
        self.pods = pods or {}
        self.writes: list[tuple[str, str, Any]] = []
        self.versions: dict[str, str] = {}

    def get_protobuf(self, resource: client.Resource, name: str, *, namespace: str = "") -> bytes:
        return kube_objects.protobuf_object(
            uid=f"uid-{name}",
            resource_version=self.versions.get(name, "3"),
            finalizers_=[controller.DELETE_PROTECTION_FINALIZER],
        )

    def update_protobuf(self, resource: client.Resource, name: str, body: bytes, *, namespace: str = "") -> Any:
        stored = finalizers.read(body)
        self.writes.append(("PUT", resource.plural, {"resourceVersion": stored.resource_version, "finalizers": []}))
        assert stored.sections[2] == b"spec", "the spec's bytes travel unchanged"
        self.versions[name] = str(len(self.writes) + 10)
        return {
            "metadata": {"name": name, "resourceVersion": self.versions[name], "finalizers": list(stored.finalizers)}
        }

    def get(self, resource: client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
        if resource is client.RESOURCE_CLAIM_TEMPLATES and name in self.templates:
            return copy.deepcopy(self.templates[name])
        if resource is client.PODS and name in self.pods:
            return copy.deepcopy(self.pods[name])
        raise client.NotFound(404, "NotFound", f"{resource.plural} {name!r} not found")

    field_manager = client.FIELD_MANAGER

    def list(self, resource: client.Resource, *, namespace: str = "", **_: Any) -> client.ListResult:
        items = tuple(copy.deepcopy(body) for body in self.pods.values()) if resource is client.PODS else ()
        return client.ListResult(items, "1")

    def create(self, resource: client.Resource, body: dict[str, Any], *, namespace: str = "") -> dict[str, Any]:
        self.writes.append(("POST", resource.plural, body))
        return {**body, "metadata": {**body["metadata"], "name": "made", "resourceVersion": "8"}}

    def patch(
        self, resource: client.Resource, name: str, patch: dict[str, Any], *, namespace: str = "", subresource: str = ""
    ) -> dict[str, Any]:
        self.writes.append(("PATCH", f"{resource.plural}/{subresource}".rstrip("/"), patch))
        self.versions[name] = str(len(self.writes) + 10)
        return {"metadata": {"name": name, "resourceVersion": self.versions[name]}}

    def delete(
        self, resource: client.Resource, name: str, *, namespace: str = "", resource_version: str = "", uid: str = ""
    ) -> None:
        self.writes.append(("DELETE", resource.plural, {"name": name, "resourceVersion": resource_version, "uid": uid}))


def _controller(
    stub: StubClient, *, pods: tuple[controller.PodState, ...] = (), claims: tuple[Any, ...] = ()
) -> controller.ClaimController:
    ctl = controller.ClaimController(stub, registry=prometheus_client.CollectorRegistry())  # type: ignore[arg-type]
    # Fill the caches as the informers would after their first list (the stub serves no list or watch).
    for pod in pods:
        ctl.pods.store._put(pod.key, pod.pod.meta.resource_version, pod)
    for item in claims:
        ctl.claims.store._put(item.key, item.meta.resource_version, item)
    return ctl


def _events(stub: StubClient) -> list[tuple[str, str]]:
    return [
        (body["reason"], body["message"])
        for method, plural, body in stub.writes
        if method == "POST" and plural == "events"
    ]


def test_a_template_the_model_refuses_gets_one_warning_and_no_retry() -> None:
    """Guards: an invalid stored template gives a Warning Event naming the template, the pod's field and the bad
    field, creates nothing, and does not raise (no retry loop)."""
    bad = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad", "namespace": "ns"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": "c"},
                            "firstAvailable": [{"name": "a", "deviceClassName": "c"}],
                        }
                    ]
                }
            }
        },
    }
    stub = StubClient(templates={"bad": bad})
    pod = build.pod(templates={"gpu": "bad"})
    _controller(stub, pods=(pod,)).sync_pod("ns", "trainer")
    [(reason, message)] = _events(stub)
    assert reason == controller.FAILED_CREATION
    assert "ResourceClaimTemplate ns/bad is invalid" in message
    assert "pod ns/trainer spec.resourceClaims[gpu].resourceClaimTemplateName" in message
    assert "firstAvailable" in message
    assert [w for w in stub.writes if w[1] != "events"] == []


def test_a_missing_template_gets_a_warning_and_a_retry() -> None:
    """Guards: a template that does not exist gives a Warning Event and RetryLater (retried with backoff)."""
    stub = StubClient()
    with pytest.raises(controller.RetryLater, match="ResourceClaimTemplate ns/absent does not exist"):
        _controller(stub, pods=(build.pod(templates={"gpu": "absent"}),)).sync_pod("ns", "trainer")
    assert [reason for reason, _ in _events(stub)] == [controller.FAILED_CREATION]


def test_a_pod_sync_creates_then_records_in_that_order() -> None:
    """Guards: the writes of a first pod sync are exactly: create the claim, then patch the pod's status with the
    pod's resourceVersion as precondition."""
    template = {"metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {"devices": {}}}}
    stub = StubClient(templates={"t": template})
    _controller(stub, pods=(build.pod(templates={"gpu": "t"}),)).sync_pod("ns", "trainer")
    assert [(method, plural) for method, plural, _ in stub.writes] == [
        ("POST", "resourceclaims"),
        ("PATCH", "pods/status"),
    ]
    assert stub.writes[1][2] == {
        "metadata": {"resourceVersion": "7"},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "made"}]},
    }


def test_a_full_claim_gets_a_warning_instead_of_a_257th_reservation() -> None:
    """Guards: a bound pod is not added to a claim that already has 256 reservedFor entries: Warning Event, retry."""
    others = tuple(build.ref(build.pod(f"p{i}")) for i in range(256))
    full = build.claim("shared", allocated=True, reserved=others)
    pod = build.pod("late", node="node-a", direct={"gpu": "shared"})
    stub = StubClient()
    with pytest.raises(controller.RetryLater, match="256"):
        _controller(stub, pods=(pod,), claims=(full,)).sync_pod("ns", "late")
    assert [reason for reason, _ in _events(stub)] == [controller.RESERVATION_FAILED]
    assert [w for w in stub.writes if w[1] != "events"] == []


def test_a_finished_pods_claim_is_unreserved_deallocated_unprotected_and_deleted_in_order() -> None:
    """Guards: the writes of the cleanup are exactly: status (reservedFor and allocation cleared) at the read
    resourceVersion, finalizer removal at the new one (a protobuf PUT of the claim as stored, without the
    finalizer), delete with the UID and the newest resourceVersion; the deallocation is counted."""
    job = build.pod("job", phase="Succeeded")
    claim = build.claim("job-gpu-abcde", owner=job, reserved=(build.ref(job),), allocated=True, finalizer=True)
    stub = StubClient()
    ctl = _controller(stub, pods=(job,), claims=(claim,))
    ctl.sync_claim("ns", "job-gpu-abcde")
    assert ctl.registry.get_sample_value("dractl_claim_controller_deallocations_total") == 1
    assert stub.writes == [
        (
            "PATCH",
            "resourceclaims/status",
            {
                "metadata": {"resourceVersion": "3"},
                "status": {"reservedFor": None, "allocation": None, "devices": None},
            },
        ),
        ("PUT", "resourceclaims", {"resourceVersion": "11", "finalizers": []}),
        ("DELETE", "resourceclaims", {"name": "job-gpu-abcde", "resourceVersion": "12", "uid": "uid-job-gpu-abcde"}),
    ]


def _raw_pod(name: str, *, recorded: str) -> dict[str, Any]:
    """The pod as the API server holds it: one template pod claim `gpu`, recorded as `recorded`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "9"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": recorded}]},
    }


def test_a_duplicate_by_a_stale_cached_pod_is_confirmed_live_and_kept() -> None:
    """Guards: the cached pod records `ours`, but the API server's pod now records `theirs` (kube-controller-manager
    wrote it since): `theirs` is not deleted; the live pod decides, so the controllers do not undo each other."""
    trainer = build.pod(templates={"gpu": "one-gpu"}, recorded={"gpu": "ours"})
    theirs = build.claim("theirs", owner=trainer)
    ours = build.claim("ours", owner=trainer)
    stub = StubClient(pods={"trainer": _raw_pod("trainer", recorded="theirs")})
    ctl = _controller(stub, pods=(trainer,), claims=(theirs, ours))
    ctl.sync_claim("ns", "theirs")
    assert stub.writes == []


def test_a_duplicate_seen_before_the_recorded_claim_is_deleted_once_that_claim_arrives() -> None:
    """Guards: kube-controller-manager's claim for a pod claim arrives first, while the cache does not yet have the
    claim the pod records; when the recorded claim arrives, the earlier sibling is synced again and deleted."""
    trainer = build.pod(templates={"gpu": "one-gpu"}, recorded={"gpu": "ours"})
    theirs = build.claim("theirs", owner=trainer)
    ours = build.claim("ours", owner=trainer)
    stub = StubClient(pods={"trainer": _raw_pod("trainer", recorded="ours")})
    ctl = _controller(stub, pods=(trainer,), claims=(theirs,))

    def drain() -> list[str]:
        keys = []
        while (key := ctl.queue.get(timeout=0)) is not None:
            keys.append(key)
            ctl.queue.done(key)
        return keys

    ctl._claim_changed(None, theirs)
    assert "claim:ns/theirs" in drain()
    ctl.sync_claim("ns", "theirs")
    assert stub.writes == [], "the recorded claim is not in the cache yet: nothing is known to be a duplicate"
    ctl.claims.store._put(ours.key, ours.meta.resource_version, ours)
    ctl._claim_changed(None, ours)
    assert "claim:ns/theirs" in drain()
    ctl.sync_claim("ns", "theirs")
    assert stub.writes == [
        ("DELETE", "resourceclaims", {"name": "theirs", "resourceVersion": "3", "uid": "uid-theirs"})
    ]


def test_another_claim_controller_seen_at_work_stops_every_write_with_one_log_line_and_the_metric(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Guards: a pod kube-controller-manager recorded before the start (the first list) is history and changes
    nothing; its record of a pod while the controller runs makes the controller stop writing for good (a pod that
    still needs a claim gets none), with one warning naming the manager and the pod, and the metric at 1."""
    before = _raw_pod("early", recorded="early-gpu-x")
    before["metadata"]["managedFields"] = [build.KCM_APPLY]
    stub = StubClient(pods={"early": before}, templates={"one-gpu": {"metadata": {"name": "one-gpu"}, "spec": {}}})
    ctl = _controller(stub)
    ctl.pods._list()
    assert ctl.deferring_to is None
    assert ctl.registry.get_sample_value("dractl_claim_controller_deferring") == 0

    late = _raw_pod("late", recorded="late-gpu-y")
    late["metadata"]["managedFields"] = [{**build.KCM_APPLY, "time": "2026-11-27T05:00:00Z"}]
    ctl.pods._apply("ns/late", late)
    later = _raw_pod("later", recorded="later-gpu-z")
    later["metadata"]["managedFields"] = [{**build.KCM_APPLY, "time": "2026-11-27T05:00:01Z"}]
    ctl.pods._apply("ns/later", later)
    assert ctl.deferring_to == "ResourceClaimController"
    assert ctl.registry.get_sample_value("dractl_claim_controller_deferring") == 1
    [warning] = [r.getMessage() for r in caplog.records if "stops writing" in r.getMessage()]
    assert "'ResourceClaimController' recorded claims in pod ns/late" in warning

    needy = build.pod("needy", templates={"gpu": "one-gpu"})
    ctl.pods.store._put(needy.key, "7", needy)
    ctl.sync("pod:ns/needy")
    assert stub.writes == []


def test_a_groups_claim_is_created_and_recorded_in_its_status_with_its_version() -> None:
    """Guards: a PodGroup sync writes exactly the claim (owned by the group) and one merge patch of the group's
    status subresource carrying the group's resourceVersion; a missing template warns on the PodGroup and
    retries."""
    stub = StubClient(templates={"t": kube_objects.template("t", namespace="ns")})
    group = build.group(templates={"shared": "t"})
    ctl = _controller(stub)
    ctl.pod_groups.store._put(group.key, "5", group)
    ctl.sync_group("ns", "train")
    [(_, _, body), patch] = stub.writes
    assert body["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"
    assert patch == (
        "PATCH",
        "podgroups/status",
        {
            "metadata": {"resourceVersion": "5"},
            "status": {"resourceClaimStatuses": [{"name": "shared", "resourceClaimName": "made"}]},
        },
    )

    missing = build.group("other", templates={"shared": "gone"})
    ctl.pod_groups.store._put(missing.key, "5", missing)
    with pytest.raises(controller.RetryLater):
        ctl.sync_group("ns", "other")
    [event] = [body for method, plural, body in stub.writes if plural == "events"]
    assert event["involvedObject"]["kind"] == "PodGroup" and event["reason"] == controller.FAILED_CREATION
    assert "PodGroup ns/other spec.resourceClaims[shared].resourceClaimTemplateName" in event["message"]
