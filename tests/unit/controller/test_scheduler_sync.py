"""The scheduler's syncs over an in-memory API stub and the real allocator: the exact writes of a decision, the
rollback of every failed write, reports on pods that cannot be scheduled, what requeues whom, and the allocator's
ledger kept from claim events."""

from __future__ import annotations

import copy
from typing import Any

import prometheus_client
import pytest
from support import kube_objects
from support import scheduler_inputs as raw

from dractl import model
from dractl.controller import nodefit, schedcommit
from dractl.controller import scheduler as sched
from dractl.kube import client, finalizers, informer, workqueue


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386) applied in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class StubApi:
    """Objects by (plural, namespace, name); merge patches, protobuf PUTs (of the finalizers) and bindings honour the
    resourceVersion precondition; every write is recorded as (method, path) and `fail(method, fragment, error)`
    makes matching requests raise instead."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.bodies: list[Any] = []
        self.faults: list[list[Any]] = []  # [method, fragment, error, after, matches to let through first]
        self.version = 100

    def put(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        plural = {"Pod": "pods", "ResourceClaim": "resourceclaims"}.get(body["kind"], body["kind"].lower() + "s")
        self.objects[(plural, meta.get("namespace", ""), meta["name"])] = copy.deepcopy(body)
        return body

    def fail(self, method: str, fragment: str, error: client.ApiError, *, after: bool = False, skip: int = 0) -> None:
        """Matching requests raise `error` (with `after`, once the write has been applied, as a lost answer), after
        letting the first `skip` of them through."""
        self.faults.append([method, fragment, error, after, skip])

    def _fault(self, method: str, path: str) -> tuple[client.ApiError, bool] | None:
        for fault in self.faults:
            if fault[0] == method and fault[1] in path:
                if fault[4] > 0:
                    fault[4] -= 1
                    return None
                return fault[2], fault[3]
        return None

    def get(self, resource: client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
        fault = self._fault("GET", f"{namespace}/{resource.plural}/{name}")
        if fault is not None:
            raise fault[0]
        found = self.objects.get((resource.plural, namespace, name))
        if found is None:
            raise client.NotFound(404, "NotFound", f"{resource.plural} {name} not found")
        return copy.deepcopy(found)

    def create(
        self,
        resource: client.Resource,
        body: dict[str, Any],
        *,
        namespace: str = "",
        name: str = "",
        subresource: str = "",
    ) -> dict[str, Any]:
        path = f"{namespace}/{resource.plural}" + (f"/{name}/{subresource}" if subresource else "")
        self.writes.append(("POST", path))
        self.bodies.append(copy.deepcopy(body))
        fault = self._fault("POST", path)
        if fault is not None and not fault[1]:
            raise fault[0]
        if subresource == "binding":
            pod = self.objects[("pods", namespace, body["metadata"]["name"])]
            wanted = body["metadata"].get("resourceVersion")
            if wanted and wanted != pod["metadata"]["resourceVersion"]:
                raise client.Conflict(409, "Conflict", f"{path}: the pod has been modified")
            pod["spec"]["nodeName"] = body["target"]["name"]
            self._bump(pod)
        if fault is not None:
            raise fault[0]
        return {**body, "metadata": {**body.get("metadata", {}), "name": "made", "resourceVersion": "1"}}

    def patch(
        self,
        resource: client.Resource,
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str = "",
        subresource: str = "",
    ) -> dict[str, Any]:
        path = f"{namespace}/{resource.plural}/{name}" + (f"/{subresource}" if subresource else "")
        self.writes.append(("PATCH", path))
        self.bodies.append(copy.deepcopy(patch))
        fault = self._fault("PATCH", path)
        if fault is not None:
            raise fault[0]
        if resource.plural == "events":
            return {}
        stored = self.objects.get((resource.plural, namespace, name))
        if stored is None:
            raise client.NotFound(404, "NotFound", path)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            raise client.Conflict(409, "Conflict", f"{path}: the object has been modified")
        body = copy.deepcopy(dict(patch))
        (body.get("metadata") or {}).pop("resourceVersion", None)
        _merge(stored, body)
        self._bump(stored)
        return copy.deepcopy(stored)

    def get_protobuf(self, resource: client.Resource, name: str, *, namespace: str = "") -> bytes:
        found = self.get(resource, name, namespace=namespace)
        return kube_objects.protobuf_object(
            uid=found["metadata"]["uid"],
            resource_version=found["metadata"]["resourceVersion"],
            finalizers_=found["metadata"].get("finalizers") or (),
        )

    def update_protobuf(self, resource: client.Resource, name: str, body: bytes, *, namespace: str = "") -> Any:
        path = f"{namespace}/{resource.plural}/{name}"
        self.writes.append(("PUT", path))
        sent = finalizers.read(body)
        self.bodies.append({"finalizers": list(sent.finalizers)})
        fault = self._fault("PUT", path)
        if fault is not None:
            raise fault[0]
        stored = self.objects[(resource.plural, namespace, name)]
        if sent.resource_version != stored["metadata"]["resourceVersion"]:
            raise client.Conflict(409, "Conflict", f"{path}: the object has been modified")
        if sent.finalizers:
            stored["metadata"]["finalizers"] = list(sent.finalizers)
        else:
            stored["metadata"].pop("finalizers", None)
        self._bump(stored)
        return copy.deepcopy(stored)

    def _bump(self, stored: dict[str, Any]) -> None:
        self.version += 1
        stored["metadata"]["resourceVersion"] = str(self.version)

    def claim(self, name: str) -> dict[str, Any]:
        return self.get(client.RESOURCE_CLAIMS, name, namespace="ns")

    def pod(self, name: str) -> dict[str, Any]:
        return self.get(client.PODS, name, namespace="ns")

    def condition(self, pod: str) -> dict[str, Any]:
        """The pod's first status condition: the PodScheduled condition dractl writes."""
        return self.pod(pod)["status"]["conditions"][0]


def _feed(source: informer.Informer[Any], body: dict[str, Any]) -> None:
    """Deliver `body` as a watch event would (decode, store, handlers)."""
    source._apply(informer.key_of(body), copy.deepcopy(body))


def _delete(source: informer.Informer[Any], body: dict[str, Any]) -> None:
    source._delete(informer.key_of(body))


class Cluster:
    """A scheduler over a `StubApi`, its caches filled by hand; `sync` the pod, `seen` re-feeds the API's state."""

    def __init__(
        self,
        *,
        nodes: int = 1,
        gpus: int = 2,
        cpu: str = "8",
        racks: tuple[str, ...] = (),
        levels: tuple[str, ...] = (),
        pod_group_apis: tuple[model.PodGroupApi, ...] = (),
    ) -> None:
        self.api = StubApi()
        self.queue = workqueue.WorkQueue()
        self.scheduler = sched.Scheduler(
            self.api,  # type: ignore[arg-type]
            registry=prometheus_client.CollectorRegistry(),
            queue=self.queue,
            pod_group_apis=pod_group_apis,
            topology_levels=levels,
        )
        # Decisions wait for the claim cache to deliver their own allocation writes: here the cache counts as
        # having delivered every version the stub gives (they stay far below this one).
        self.scheduler.claims._delivered(str(10**9))
        _feed(self.scheduler.classes, raw.device_class())
        for index in range(1, nodes + 1):
            labels = {"rack": racks[index - 1]} if racks else None
            _feed(self.scheduler.nodes, raw.node(f"n{index}", cpu=cpu, labels=labels))
            _feed(self.scheduler.slices, raw.resource_slice(f"n{index}", gpus=gpus))

    def add(self, *bodies: dict[str, Any]) -> None:
        for body in bodies:
            self.api.put(body)
            _feed(self.scheduler.pods if body["kind"] == "Pod" else self.scheduler.claims, body)

    def seen(self) -> None:
        """The informers catch up with the stub's claims and pods."""
        for (plural, _, _), body in sorted(self.api.objects.items()):
            if plural == "pods":
                _feed(self.scheduler.pods, body)
            elif plural == "resourceclaims":
                _feed(self.scheduler.claims, body)

    def sync(self, name: str) -> None:
        self.scheduler.sync_pod("ns", name)

    def queued(self) -> list[str]:
        keys: list[str] = []
        while (key := self.queue.get(timeout=0)) is not None:
            keys.append(key)
            self.queue.done(key)
        return keys

    def metric(self, name: str, **labels: str) -> float | None:
        return self.scheduler.registry.get_sample_value(name, labels)


def _devices(body: dict[str, Any]) -> list[str]:
    allocation = (body.get("status") or {}).get("allocation") or {}
    return [r["device"] for r in (allocation.get("devices") or {}).get("results") or ()]


def _reserved(body: dict[str, Any]) -> list[str]:
    return [entry["name"] for entry in (body.get("status") or {}).get("reservedFor") or ()]


def test_a_decision_writes_the_finalizer_the_allocation_and_the_binding_and_a_resync_writes_nothing() -> None:
    """Guards: the exact requests of one decision, in order and nothing else (finalizer by a merge patch at the
    claim's version, status with allocation and reservedFor, binding at the version of the pod the decision was
    made from, kube-scheduler's `Scheduled` Event; no read), the metrics, and that syncing the converged pod again
    writes nothing."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("GET", "", client.ApiError(500, "Unexpected", "the decision read something"))
    cluster.sync("trainer")
    cluster.api.faults.clear()
    assert cluster.api.writes == [
        ("PATCH", "ns/resourceclaims/c"),
        ("PATCH", "ns/resourceclaims/c/status"),
        ("POST", "ns/pods/trainer/binding"),
        ("POST", "ns/events"),
    ]
    assert cluster.api.bodies[0] == {"metadata": {"resourceVersion": "3", "finalizers": [raw.FINALIZER]}}
    assert cluster.api.bodies[2]["metadata"]["resourceVersion"] == "5"
    event = cluster.api.bodies[3]
    assert (event["type"], event["reason"], event["message"]) == (
        "Normal",
        "Scheduled",
        "Successfully assigned ns/trainer to n1",
    )
    stored = cluster.api.claim("c")
    assert stored["metadata"]["finalizers"] == [raw.FINALIZER]
    assert _devices(stored) == ["gpu-0"] and _reserved(stored) == ["trainer"]
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"
    assert cluster.metric("dractl_scheduler_attempts_total", result="scheduled") == 1
    assert cluster.metric("dractl_scheduler_claims_allocated_total") == 1

    cluster.sync("trainer")  # The cache has not seen the binding yet: the assumed pod is left alone.
    cluster.seen()
    cluster.sync("trainer")
    assert len(cluster.api.writes) == 4


def test_a_claim_with_opaque_configuration_gets_its_finalizer_by_a_protobuf_read_and_put() -> None:
    """Guards: a claim whose spec holds opaque parameters (stored as raw bytes, which a patch's JSON round trip would
    re-encode) gets the finalizer through `finalizers.change`: a protobuf GET and PUT at the claim's version, then
    the status and the binding as for any claim."""
    cluster = Cluster()
    sharing = {"apiVersion": "gpu.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    cluster.add(raw.claim("c", opaque=sharing), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    assert cluster.api.writes == [
        ("PUT", "ns/resourceclaims/c"),
        ("PATCH", "ns/resourceclaims/c/status"),
        ("POST", "ns/pods/trainer/binding"),
        ("POST", "ns/events"),
    ]
    assert cluster.api.bodies[0] == {"finalizers": [raw.FINALIZER]}
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"


def test_pods_bound_but_not_yet_seen_bound_count_on_their_node() -> None:
    """Guards: decisions are assumed: a second pod does not get the CPUs the first (bound, cache behind) took."""
    cluster = Cluster(cpu="8")
    cluster.add(raw.pod("first", cpu="5"), raw.pod("second", cpu="5"))
    cluster.scheduler.open_ledger()
    cluster.sync("first")
    cluster.sync("second")
    assert cluster.api.pod("first")["spec"]["nodeName"] == "n1"
    condition = cluster.api.condition("second")
    assert condition["message"] == "0/1 nodes are available: 1 Insufficient cpu."


def test_the_node_filters_remembered_answers_follow_every_change_of_usage_and_nodes() -> None:
    """Guards: the node filter's answers, kept per pod shape and brought up to date from the nodes changed since,
    equal `nodefit` computed afresh over every node after each change: pods bound and finished, a pod assumed by a
    decision, a node added, changed (cordoned) and deleted, and a second pod shape used in between."""
    cluster = Cluster(nodes=3, cpu="4")
    cluster.scheduler.open_ledger()
    needs = {size: nodefit.PodNeeds.from_raw(raw.pod(f"probe-{size}", cpu=size)) for size in ("1", "3")}

    def agrees() -> None:
        for size, probe in needs.items():
            feasible, reasons, infos = cluster.scheduler._fit.filter(probe)
            fresh = nodefit.filter_nodes(probe, infos, cluster.scheduler._fit.usage())
            assert (sorted(feasible), reasons) == fresh, size
            assert list(feasible) == sorted(feasible)

    agrees()
    cluster.add(raw.pod("a", node="n1", cpu="2"), raw.pod("b", node="n2", cpu="3"))
    agrees()
    cluster.add(raw.pod("c", cpu="2"))
    cluster.sync("c")  # Assumed on a node before the cache sees it bound.
    agrees()
    _delete(cluster.scheduler.pods, raw.pod("b", node="n2", cpu="3"))
    agrees()
    _feed(cluster.scheduler.nodes, raw.node("n4", cpu="2"))
    agrees()
    _feed(cluster.scheduler.nodes, {**raw.node("n1", cpu="4"), "spec": {"unschedulable": True}})
    agrees()
    _delete(cluster.scheduler.nodes, raw.node("n3", cpu="4"))
    agrees()
    finished = raw.pod("a", node="n1", cpu="2")
    finished["status"]["phase"] = "Succeeded"
    _feed(cluster.scheduler.pods, finished)
    agrees()


def test_a_conflict_on_the_allocation_takes_back_the_finalizer_and_gives_back_the_devices() -> None:
    """Guards: a 409 on the status write raises (retry with backoff) after removing the finalizer this attempt
    added, then says on the pod (condition SchedulerError, Warning Event) which step failed; the allocator holds
    nothing for the claim, so the retry allocates the same device again."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("PATCH", "resourceclaims/c/status", client.Conflict(409, "Conflict", "modified"))
    with pytest.raises(client.Conflict):
        cluster.sync("trainer")
    assert cluster.api.writes == [
        ("PATCH", "ns/resourceclaims/c"),
        ("PATCH", "ns/resourceclaims/c/status"),
        ("PUT", "ns/resourceclaims/c"),
        ("POST", "ns/events"),
        ("PATCH", "ns/pods/trainer/status"),
    ]
    condition = cluster.api.condition("trainer")
    assert (condition["reason"], condition["message"]) == (
        "SchedulerError",
        "scheduling on node n1 failed while writing the allocation of ResourceClaim ns/c: 409 Conflict: modified",
    )
    stored = cluster.api.claim("c")
    assert not stored["metadata"].get("finalizers") and _devices(stored) == []
    assert cluster.scheduler.allocator.held("uid-c") is None
    assert cluster.metric("dractl_scheduler_attempts_total", result="error") == 1

    cluster.api.faults.clear()
    cluster.seen()
    cluster.sync("trainer")
    assert _devices(cluster.api.claim("c")) == ["gpu-0"]
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"


def test_a_failed_binding_takes_back_the_allocation_and_the_reservation() -> None:
    """Guards: when the binding fails, the claim this decision allocated is deallocated (allocation, reservedFor
    and the finalizer it added), so no claim stays allocated for an unbound pod, and the devices are free again."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("POST", "binding", client.Transient(500, "InternalError", "boom"))
    with pytest.raises(client.Transient):
        cluster.sync("trainer")
    stored = cluster.api.claim("c")
    assert _devices(stored) == [] and _reserved(stored) == [] and not stored["metadata"].get("finalizers")
    assert not cluster.api.pod("trainer")["spec"].get("nodeName")
    assert cluster.scheduler.allocator.held("uid-c") is None
    [event] = [body for body in cluster.api.bodies if isinstance(body, dict) and body.get("kind") == "Event"]
    assert event["reason"] == "FailedScheduling" and "boom" in event["message"]


def test_a_pod_recording_another_claim_before_its_binding_is_not_bound_and_the_allocation_is_taken_back() -> None:
    """Guards: the cache says the pod records claim `ours`, but the API's pod records `theirs` (kube-controller-manager
    recorded its own claim meanwhile): the binding at the decision's version is refused, the live read shows
    `theirs`, so the pod is not bound, `ours` is deallocated and unprotected again, the pod says why (SchedulerError
    naming both claims); once the cache shows `theirs`, the retry allocates and binds with it."""
    cluster = Cluster()
    cluster.add(
        raw.claim("ours", owner="trainer"),
        raw.claim("theirs", owner="trainer"),
        raw.pod(templates={"gpu": "one-gpu"}, recorded={"gpu": "ours"}),
    )
    cluster.scheduler.open_ledger()
    cluster.api.put(raw.pod(templates={"gpu": "one-gpu"}, recorded={"gpu": "theirs"}, version="6"))
    with pytest.raises(schedcommit.PodChanged, match="records theirs for spec.resourceClaims.gpu. now, not ours"):
        cluster.sync("trainer")
    assert cluster.api.writes.count(("POST", "ns/pods/trainer/binding")) == 1
    assert not cluster.api.pod("trainer")["spec"].get("nodeName")
    ours = cluster.api.claim("ours")
    assert _devices(ours) == [] and _reserved(ours) == [] and not ours["metadata"].get("finalizers")
    assert cluster.scheduler.allocator.held("uid-ours") is None
    condition = cluster.api.condition("trainer")
    assert condition["reason"] == "SchedulerError"
    assert "failed while binding to node n1: pod ns/trainer records theirs" in condition["message"]

    cluster.seen()
    cluster.sync("trainer")
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"
    assert _reserved(cluster.api.claim("theirs")) == ["trainer"] and _devices(cluster.api.claim("ours")) == []


def test_a_pod_changed_in_something_else_is_bound_at_the_version_a_live_read_gives() -> None:
    """Guards: a pod written by someone else since the decision (not its claims) makes the binding at the decision's
    version fail (409); the live read shows the same claims, and the binding at the read's version binds it."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api._bump(cluster.api.objects[("pods", "ns", "trainer")])  # A label written by someone else, say.
    cluster.sync("trainer")
    bindings = [body for body in cluster.api.bodies if isinstance(body, dict) and body.get("kind") == "Binding"]
    assert [binding["metadata"]["resourceVersion"] for binding in bindings] == ["5", "101"]
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"
    assert _devices(cluster.api.claim("c")) == ["gpu-0"]


def test_a_pod_changed_between_its_read_and_its_binding_is_refused_by_the_precondition() -> None:
    """Guards: the binding carries the version of the pod it is sure of (the decision's, then the live read's), so a
    pod changed again between that read and the binding is not bound (409) and the allocation is taken back."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api._bump(cluster.api.objects[("pods", "ns", "trainer")])
    real_get = cluster.api.get

    def get_then_change(resource: client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
        found = real_get(resource, name, namespace=namespace)
        if resource is client.PODS:
            cluster.api._bump(cluster.api.objects[("pods", namespace, name)])  # Written by someone else at once.
        return found

    cluster.api.get = get_then_change  # type: ignore[method-assign]
    with pytest.raises(client.Conflict):
        cluster.sync("trainer")
    assert not cluster.api.pod("trainer")["spec"].get("nodeName")
    assert _devices(cluster.api.claim("c")) == []


def test_each_failed_attempt_replaces_what_the_pod_says() -> None:
    """Guards: the pod's condition and Events follow the attempts: a failed binding gives SchedulerError with its
    error, and the next attempt's failure replaces that message (a new Event with the new message)."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("POST", "binding", client.Transient(500, "InternalError", "first"))
    with pytest.raises(client.Transient):
        cluster.sync("trainer")
    assert cluster.api.condition("trainer")["message"].endswith("while binding to node n1: 500 InternalError: first")
    cluster.api.faults.clear()
    cluster.api.fail("POST", "binding", client.Transient(503, "Unavailable", "second"))
    cluster.seen()
    with pytest.raises(client.Transient):
        cluster.sync("trainer")
    condition = cluster.api.condition("trainer")
    assert (condition["reason"], condition["message"]) == (
        "SchedulerError",
        "scheduling on node n1 failed while binding to node n1: 503 Unavailable: second",
    )
    events = [body["message"] for body in cluster.api.bodies if isinstance(body, dict) and body.get("kind") == "Event"]
    assert [message.rsplit(": ", 1)[-1] for message in events] == ["first", "second"]


def test_a_failed_binding_keeps_a_shared_claims_allocation_and_removes_only_the_pod() -> None:
    """Guards: for a claim that was already allocated (shared with another pod) only this pod's reservedFor entry
    is taken back; the allocation and the allocator's hold stay."""
    cluster = Cluster()
    cluster.add(raw.claim("s", allocated_on="n1", reserved=("other",), finalizer=True), raw.pod(claims={"gpu": "s"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("POST", "binding", client.Transient(500, "InternalError", "boom"))
    with pytest.raises(client.Transient):
        cluster.sync("trainer")
    stored = cluster.api.claim("s")
    assert _devices(stored) == ["gpu-0"] and _reserved(stored) == ["other"]
    assert stored["metadata"]["finalizers"] == [raw.FINALIZER]
    assert cluster.scheduler.allocator.held("uid-s") is not None


def test_a_binding_whose_answer_was_lost_counts_as_bound() -> None:
    """Guards: a binding refused although it landed (a retried POST answered 409) is recognised by reading the pod:
    nothing is taken back."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("POST", "binding", client.Conflict(409, "Conflict", "already assigned"), after=True)
    cluster.sync("trainer")
    assert _devices(cluster.api.claim("c")) == ["gpu-0"]
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"


def test_an_unschedulable_pod_gets_the_condition_and_one_event_and_a_resync_writes_nothing() -> None:
    """Guards: the condition (summary plus the allocator's reason naming the claim and request), one Warning
    Event, the gauge, and no write when syncing again over the same state; a freed claim requeues the pod."""
    cluster = Cluster(gpus=1)
    cluster.add(raw.claim("two", count=2), raw.pod(claims={"gpu": "two"}))
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    assert cluster.api.writes == [("PATCH", "ns/pods/trainer/status"), ("POST", "ns/events")]
    condition = cluster.api.condition("trainer")
    assert (condition["type"], condition["status"], condition["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert condition["message"].startswith("0/1 nodes are available: 1 cannot allocate all claims. ")
    assert "ResourceClaim ns/two request gpu" in condition["message"]
    assert cluster.api.bodies[1]["message"] == condition["message"]
    assert cluster.metric("dractl_scheduler_unschedulable_pods") == 1

    cluster.seen()
    cluster.queued()
    cluster.sync("trainer")
    assert len(cluster.api.writes) == 2
    _feed(cluster.scheduler.slices, raw.resource_slice("n1", gpus=2) | {"metadata": {"name": "n1-slice"}})
    assert cluster.queued() == ["ns/trainer"]


def test_a_pod_asking_for_what_dractl_cannot_check_is_reported_and_not_retried_on_cluster_changes() -> None:
    """Guards: an unsupported feature (required pod anti-affinity) is reported on the pod (condition, Event) instead
    of ignored, and cluster changes do not requeue it."""
    cluster = Cluster()
    term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
    pod = raw.pod(affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}})
    cluster.add(pod)
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    message = cluster.api.condition("trainer")["message"]
    assert "podAntiAffinity" in message and not cluster.api.pod("trainer")["spec"].get("nodeName")
    assert ("POST", "ns/events") in cluster.api.writes
    cluster.queued()
    _feed(cluster.scheduler.nodes, raw.node("n9"))
    assert cluster.queued() == []
    assert cluster.metric("dractl_scheduler_unschedulable_pods") == 1


def _claim_with_negative_count() -> dict[str, Any]:
    bad = raw.claim("bad")
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = -1
    return bad


@pytest.mark.parametrize(
    ("bodies", "named"),
    [
        pytest.param([raw.pod(cpu="abc")], ("trainer", "cpu"), id="pod-unreadable-cpu"),
        pytest.param(
            [_claim_with_negative_count(), raw.pod(claims={"gpu": "bad"})],
            ("ResourceClaim ns/bad", "invalid"),
            id="claim-the-model-refuses",
        ),
    ],
)
def test_bad_input_is_reported_on_the_pod_by_name(bodies: list[dict[str, Any]], named: tuple[str, ...]) -> None:
    """Guards: bad input on the pod (cpu "abc") gets one message naming the pod and the field, no traceback; a claim
    that does not decode is reported on the pod using it (not waited for in silence)."""
    cluster = Cluster()
    cluster.add(*bodies)
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    message = cluster.api.condition("trainer")["message"]
    assert all(part in message for part in named), message


def test_pods_of_other_schedulers_and_bound_pods_are_never_written() -> None:
    """Guards: syncing another scheduler's pod, or a pod already bound, writes nothing and queues nothing."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod("theirs", scheduler="default-scheduler", claims={"gpu": "c"}))
    cluster.add(raw.pod("bound", node="n1"))
    cluster.scheduler.open_ledger()
    assert cluster.queued() == []
    cluster.sync("theirs")
    cluster.sync("bound")
    assert cluster.api.writes == []


def test_a_pod_waits_for_its_claim_and_is_queued_when_it_appears() -> None:
    """Guards: a missing claim means no write; another claim appearing does not queue the pod, creating its claim
    does, and the pod is then scheduled."""
    cluster = Cluster()
    cluster.add(raw.pod(claims={"gpu": "late"}))
    cluster.scheduler.open_ledger()
    cluster.queued()
    cluster.sync("trainer")
    assert cluster.api.writes == []
    cluster.add(raw.claim("unrelated"))
    assert cluster.queued() == []
    cluster.add(raw.claim("late"))
    assert cluster.queued() == ["ns/trainer"]
    cluster.sync("trainer")
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"


def test_a_shared_claim_written_but_not_yet_seen_makes_the_second_pod_wait_then_join_on_the_same_node() -> None:
    """Guards: while the cache lags behind the first pod's allocation, the second pod waits (no second allocation);
    once the claim is seen allocated it is reserved for the second pod on the same node."""
    cluster = Cluster(nodes=2)
    cluster.add(raw.claim("s"), raw.pod("first", claims={"gpu": "s"}), raw.pod("second", claims={"gpu": "s"}))
    cluster.scheduler.open_ledger()
    cluster.sync("first")
    node = cluster.api.pod("first")["spec"]["nodeName"]
    writes = len(cluster.api.writes)
    cluster.sync("second")
    assert len(cluster.api.writes) == writes
    cluster.queued()
    cluster.seen()
    assert "ns/second" in cluster.queued()
    cluster.sync("second")
    assert cluster.api.pod("second")["spec"]["nodeName"] == node
    assert _reserved(cluster.api.claim("s")) == ["first", "second"]
    assert len(_devices(cluster.api.claim("s"))) == 1


def test_claims_allocated_in_the_api_are_held_and_released_when_deallocated() -> None:
    """Guards: an allocation seen before the first decision is held (the pod gets the other GPU); when the claim
    is deallocated or deleted the allocator gives the device back."""
    cluster = Cluster(gpus=2)
    taken = raw.claim("taken", allocated_on="n1", devices=("gpu-0",))
    cluster.add(taken, raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    assert _devices(cluster.api.claim("c")) == ["gpu-1"]
    assert cluster.scheduler.allocator.held("uid-taken") is not None
    _feed(cluster.scheduler.claims, raw.claim("taken", version="9"))
    assert cluster.scheduler.allocator.held("uid-taken") is None
    _feed(cluster.scheduler.claims, raw.claim("taken", allocated_on="n1", version="10"))
    assert cluster.scheduler.allocator.held("uid-taken") is not None
    _delete(cluster.scheduler.claims, taken)
    assert cluster.scheduler.allocator.held("uid-taken") is None


def test_a_stale_event_older_than_a_decision_does_not_drop_its_hold() -> None:
    """Guards: an event showing the claim unallocated (e.g. the finalizer write) that arrives after the decision
    does not release the devices the decision holds: only a transition allocated -> unallocated releases."""
    cluster = Cluster(gpus=1)
    cluster.add(raw.claim("c"), raw.claim("d"), raw.pod(claims={"gpu": "c"}), raw.pod("other", claims={"gpu": "d"}))
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    _feed(cluster.scheduler.claims, raw.claim("c", finalizer=True, version="50"))
    assert cluster.scheduler.allocator.held("uid-c") is not None
    cluster.sync("other")
    assert not cluster.api.pod("other")["spec"].get("nodeName")


def test_a_rollback_that_cannot_write_keeps_the_hold_and_the_next_sync_binds_with_the_same_devices() -> None:
    """Guards: when taking back the allocation fails too (the API still shows it), the allocator keeps holding the
    devices (nobody else gets them); the next sync reads the claim, and once the cache shows it allocated and
    reserved for the pod, binds the pod there without a second allocation."""
    cluster = Cluster(gpus=2)
    cluster.add(raw.claim("c"), raw.claim("d"), raw.pod(claims={"gpu": "c"}), raw.pod("other", claims={"gpu": "d"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("POST", "binding", client.Transient(500, "InternalError", "boom"))
    cluster.api.fail("PATCH", "resourceclaims/c/status", client.Transient(503, "Unavailable", "down"), skip=1)
    with pytest.raises(client.Transient):
        cluster.sync("trainer")
    assert _devices(cluster.api.claim("c")) == ["gpu-0"]  # The undo did not land.
    assert cluster.scheduler.allocator.held("uid-c") is not None
    cluster.api.faults.clear()
    cluster.sync("other")
    assert _devices(cluster.api.claim("d")) == ["gpu-1"]  # Not gpu-0: it is still held for c.

    cluster.sync("trainer")  # Reads the claim: allocated, so it stays held and the pod waits for the cache.
    assert not cluster.api.pod("trainer")["spec"].get("nodeName")
    cluster.seen()
    cluster.sync("trainer")
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"
    assert _devices(cluster.api.claim("c")) == ["gpu-0"]


def test_a_rollback_that_cannot_read_the_claim_releases_once_the_claim_is_read_unallocated() -> None:
    """Guards: when the allocation write failed and the rollback cannot even read the claim, the devices stay held
    (the API's state is unknown); the next sync reads the claim unallocated, releases them and schedules again."""
    cluster = Cluster(gpus=1)
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    cluster.api.fail("PATCH", "resourceclaims/c/status", client.Transient(503, "Unavailable", "down"))
    cluster.api.fail("GET", "resourceclaims/c", client.Transient(503, "Unavailable", "down"))
    with pytest.raises(client.Transient):
        cluster.sync("trainer")
    assert cluster.scheduler.allocator.held("uid-c") is not None
    cluster.api.faults.clear()
    cluster.seen()  # The cache sees the finalizer that landed.
    cluster.sync("trainer")
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"
    assert _devices(cluster.api.claim("c")) == ["gpu-0"]


def test_a_node_that_grows_takes_a_pod_it_refused_before() -> None:
    """Guards: the node filter's remembered answers go stale when the node changes: a pod refused for CPU is
    queued again by the node's update and then bound there."""
    cluster = Cluster(cpu="1")
    cluster.add(raw.pod(cpu="2"))
    cluster.scheduler.open_ledger()
    cluster.sync("trainer")
    assert "Insufficient cpu" in cluster.api.condition("trainer")["message"]
    cluster.seen()
    cluster.queued()
    _feed(cluster.scheduler.nodes, raw.node("n1", cpu="8"))
    assert cluster.queued() == ["ns/trainer"]
    cluster.sync("trainer")
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"


def test_an_allocation_of_the_same_device_written_first_elsewhere_makes_the_decision_go_back_and_retry() -> None:
    """Guards: two schedulers, one device: when the claim cache, brought up to the decision's own allocation write,
    shows another claim allocated the same GPU (written before it, as by kube-scheduler), the decision is taken back
    before its binding (allocation cleared, finalizer removed), the pod says why, the metric counts it, the other
    claim keeps its hold, and the retry binds the pod with the other GPU."""
    cluster = Cluster()
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    original = cluster.api.patch

    def patch_then_deliver_the_other(
        resource: client.Resource, name: str, patch: dict[str, Any], **kw: Any
    ) -> dict[str, Any]:
        """The claim cache delivers another claim on the chosen GPU right after the decision's allocation write."""
        stored = original(resource, name, patch, **kw)
        if name == "c" and kw.get("subresource") == "status" and "allocation" in patch["status"]:
            [device] = [result.device for result in cluster.scheduler.allocator.held("uid-c").results]
            _feed(cluster.scheduler.claims, raw.claim("other", allocated_on="n1", devices=(device,)))
        return stored

    cluster.api.patch = patch_then_deliver_the_other  # type: ignore[method-assign]
    with pytest.raises(
        schedcommit.Contested, match="device gpu.nvidia.com/n1/gpu-0 is allocated to ResourceClaim ns/other"
    ):
        cluster.sync("trainer")
    assert cluster.api.writes == [
        ("PATCH", "ns/resourceclaims/c"),
        ("PATCH", "ns/resourceclaims/c/status"),
        ("PATCH", "ns/resourceclaims/c/status"),
        ("PUT", "ns/resourceclaims/c"),
        ("POST", "ns/events"),
        ("PATCH", "ns/pods/trainer/status"),
    ]
    stored = cluster.api.claim("c")
    assert _devices(stored) == [] and not stored["metadata"].get("finalizers")
    assert "nodeName" not in cluster.api.pod("trainer")["spec"]
    condition = cluster.api.condition("trainer")
    assert condition["reason"] == "SchedulerError"
    assert condition["message"].startswith(
        "scheduling on node n1 failed while checking that no other scheduler allocated the same devices first: "
        "ResourceClaim ns/c: device gpu.nvidia.com/n1/gpu-0 is allocated to ResourceClaim ns/other too"
    ), condition["message"]
    assert cluster.metric("dractl_scheduler_contested_total") == 1
    assert cluster.scheduler.allocator.held("uid-c") is None
    assert cluster.scheduler.allocator.held("uid-other") is not None

    cluster.api.patch = original  # type: ignore[method-assign]
    cluster.seen()
    cluster.sync("trainer")
    assert _devices(cluster.api.claim("c")) == ["gpu-1"]
    assert cluster.api.pod("trainer")["spec"]["nodeName"] == "n1"


def test_a_claim_cache_that_does_not_catch_up_in_time_leaves_the_pod_unbound_and_retried() -> None:
    """Guards: when the claim cache has not delivered the decision's own finalizer write within the confirm timeout,
    nothing is allocated nor bound: the finalizer is taken back and the attempt raises (retried with backoff)."""
    cluster = Cluster()
    cluster.scheduler.claims._delivered("1")
    cluster.scheduler._committer.confirm_timeout = 0.05
    cluster.add(raw.claim("c"), raw.pod(claims={"gpu": "c"}))
    cluster.scheduler.open_ledger()
    with pytest.raises(schedcommit.Contested, match="did not show the write at resourceVersion 101 within 0.05s"):
        cluster.sync("trainer")
    assert cluster.api.writes[:2] == [("PATCH", "ns/resourceclaims/c"), ("PUT", "ns/resourceclaims/c")]
    assert ("POST", "ns/pods/trainer/binding") not in cluster.api.writes
    assert _devices(cluster.api.claim("c")) == []
    assert cluster.scheduler.allocator.held("uid-c") is None


# --- Gangs (PodGroups) -------------------------------------------------------------------------

WORKLOAD = model.PodGroupApi.WORKLOAD
COSCHEDULING = model.PodGroupApi.COSCHEDULING


def _gang(cluster: Cluster, group: dict[str, Any], *members: str, gpus: int = 2) -> None:
    """Feed the PodGroup, and per member a claim for `gpus` GPUs and the pod joining the group."""
    api = COSCHEDULING if group["apiVersion"].startswith("scheduling.x-k8s.io") else WORKLOAD
    _feed(cluster.scheduler.pod_groups[api], group)
    for name in members:
        pod = raw.member(name, group=group["metadata"]["name"])
        if api is COSCHEDULING:
            del pod["spec"]["schedulingGroup"]
            pod["metadata"]["labels"] = {model.POD_GROUP_LABEL: group["metadata"]["name"]}
        cluster.add(raw.claim(name, count=gpus), pod)


def test_a_gang_that_does_not_fit_whole_writes_no_claim_and_every_pod_says_the_gangs_line() -> None:
    """Guards: a 4-pod gang on room for 3 gets no claim write and no binding; each of its pods gets
    PodScheduled=False (Unschedulable) with the gang's one line and a FailedScheduling Event; a resync writes
    nothing."""
    cluster = Cluster(nodes=3, pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=4), "p0", "p1", "p2", "p3")
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    assert all("resourceclaims" not in path and "binding" not in path for _, path in cluster.api.writes)
    line = "gang ns/train (minCount 4): the cluster fits 3 of 4 pods: 1 pod short, 2 GPUs of class gpu.nvidia.com"
    for name in ("p0", "p1", "p2", "p3"):
        condition = cluster.api.condition(name)
        assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
        assert condition["message"] == line
    assert cluster.api.writes.count(("POST", "ns/events")) == 4
    cluster.seen()
    before = len(cluster.api.writes)
    for name in ("p0", "p1", "p2", "p3"):
        cluster.sync(name)
    assert len(cluster.api.writes) == before


def test_a_gang_that_fits_writes_every_pods_claims_before_binding_any() -> None:
    """Guards: one sync of one member places the whole gang: every claim's finalizer and allocation are written
    before the first binding, then every pod is bound, each to its own node."""
    cluster = Cluster(nodes=4, pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=4), "p0", "p1", "p2", "p3")
    cluster.scheduler.open_ledger()
    cluster.sync("p2")
    bindings = [index for index, (_, path) in enumerate(cluster.api.writes) if path.endswith("/binding")]
    claim_writes = [index for index, (_, path) in enumerate(cluster.api.writes) if "resourceclaims" in path]
    assert len(bindings) == 4 and len(claim_writes) == 8
    assert max(claim_writes) < min(bindings)
    nodes = {cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1", "p2", "p3")}
    assert nodes == {"n1", "n2", "n3", "n4"}
    assert cluster.metric("dractl_scheduler_attempts_total", result="scheduled") == 4
    writes = len(cluster.api.writes)
    cluster.sync("p0")  # assumed with its gang: nothing more
    assert len(cluster.api.writes) == writes


def test_a_failed_allocation_write_of_one_member_takes_back_every_members_writes() -> None:
    """Guards: all or none: when the third member's allocation cannot be written, the two written before are taken
    back (allocation and finalizer), no pod is bound, every pod says which pod and step failed, and the devices are
    free again: the retry binds the whole gang."""
    cluster = Cluster(nodes=3, pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=3), "p0", "p1", "p2")
    cluster.scheduler.open_ledger()
    cluster.api.fail("PATCH", "ns/resourceclaims/p2/status", client.ApiError(500, "InternalError", "etcd hiccup"))
    with pytest.raises(client.ApiError):
        cluster.sync("p0")
    assert all(not path.endswith("/binding") for _, path in cluster.api.writes)
    for name in ("p0", "p1", "p2"):
        stored = cluster.api.claim(name)
        assert "allocation" not in (stored.get("status") or {})
        assert not stored["metadata"].get("finalizers")
        condition = cluster.api.condition(name)
        assert condition["reason"] == "SchedulerError"
        assert "pod ns/p2 failed while writing the allocation of ResourceClaim ns/p2" in condition["message"]
    cluster.api.faults.clear()
    cluster.seen()
    cluster.sync("p1")
    assert sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1", "p2")) == ["n1", "n2", "n3"]


def test_two_gangs_for_the_same_room_end_one_bound_and_one_waiting() -> None:
    """Guards: two gangs that fit one at a time: the first decided is bound whole, the other none of it, with the
    gang's line."""
    cluster = Cluster(nodes=2, pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group("a", min_count=2), "a0", "a1")
    _gang(cluster, raw.pod_group("b", min_count=2), "b0", "b1")
    cluster.scheduler.open_ledger()
    cluster.sync("b1")
    cluster.sync("a0")
    cluster.seen()
    cluster.sync("a1")
    assert [cluster.api.pod(name)["spec"].get("nodeName", "") for name in ("a0", "a1")] == ["", ""]
    assert sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("b0", "b1")) == ["n1", "n2"]
    assert cluster.api.condition("a0")["message"].startswith("gang ns/a (minCount 2): the cluster fits 0 of 2 pods")


def test_a_gang_with_a_rack_key_goes_to_one_rack_and_a_pod_that_joins_later_goes_there_too() -> None:
    """Guards: the required topology key keeps the gang in one rack (the one that holds it), and a member created
    after the gang runs goes to the gang's rack though a node of another rack comes first."""
    cluster = Cluster(nodes=4, racks=("r1", "r2", "r2", "r2"), pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=2, key="rack"), "p0", "p1")
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    placed = sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1"))
    assert placed == ["n2", "n3"]  # r1 holds one 2-GPU pod only
    cluster.seen()
    _gang(cluster, raw.pod_group(min_count=2, key="rack"), "p2")
    cluster.sync("p2")
    assert cluster.api.pod("p2")["spec"]["nodeName"] == "n4"


def test_a_pod_joining_a_running_gang_whose_rack_is_full_waits_and_says_so() -> None:
    """Guards: a pod that joins a running gang is never placed outside the gang's rack, even where another rack has
    room: it says the gang runs there and why it does not fit."""
    cluster = Cluster(nodes=3, racks=("r1", "r2", "r2"), pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=2, key="rack"), "p0", "p1")
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    cluster.seen()
    _gang(cluster, raw.pod_group(min_count=2, key="rack"), "p2")
    cluster.sync("p2")
    assert not cluster.api.pod("p2")["spec"].get("nodeName")
    message = cluster.api.condition("p2")["message"]
    assert message.startswith(
        "gang ns/train (minCount 2, topology rack) runs in rack=r2; the pods joining it do not fit there: ns/p2: "
    ), message


def test_a_member_without_claims_goes_to_its_gangs_rack_too() -> None:
    """Guards: a pod of a gang that no claim pins to a node is placed in the gang's rack, not on the first node that
    fits it."""
    cluster = Cluster(nodes=3, racks=("r1", "r2", "r2"), pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=3, key="rack"), "p0", "p1")
    cluster.add(raw.pod("helper", schedulingGroup={"podGroupName": "train"}))
    cluster.scheduler.open_ledger()
    cluster.sync("helper")
    assert sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1")) == ["n2", "n3"]
    assert cluster.api.pod("helper")["spec"]["nodeName"] in ("n2", "n3")


def test_a_gang_goes_to_the_smallest_domain_of_the_preferred_levels_that_holds_it() -> None:
    """Guards: --topology-levels: with no key of its own, a 2-pod gang goes to the smaller rack that holds it whole,
    leaving the larger rack whole for a larger gang."""
    cluster = Cluster(nodes=5, racks=("r1", "r1", "r1", "r2", "r2"), levels=("rack",), pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=2), "p0", "p1")
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    assert sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1")) == ["n4", "n5"]


def test_a_gang_with_fewer_pods_than_its_min_count_waits_and_says_so() -> None:
    """Guards: pods of a gang are not placed before minCount of them exist; they say how many exist."""
    cluster = Cluster(nodes=4, pod_group_apis=(WORKLOAD,))
    _gang(cluster, raw.pod_group(min_count=3), "p0", "p1")
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    assert all("resourceclaims" not in path for _, path in cluster.api.writes)
    assert (
        cluster.api.condition("p1")["message"] == "gang ns/train (minCount 3): 2 member pods, fewer than its minCount"
    )


def test_pods_wait_for_their_pod_group_and_are_queued_when_it_appears() -> None:
    """Guards: a pod naming a PodGroup that does not exist is not scheduled alone: it says it waits for the group,
    and is queued again when the group appears; a group of an API the server does not serve is named as such."""
    cluster = Cluster(nodes=2, pod_group_apis=(WORKLOAD,))
    cluster.add(raw.claim("p0"), raw.member("p0"))
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    message = cluster.api.condition("p0")["message"]
    assert message == (
        "waiting for PodGroup ns/train (scheduling.k8s.io/v1alpha2) to exist (the pods of a gang wait for their "
        "PodGroup)"
    )
    cluster.queued()
    _feed(cluster.scheduler.pod_groups[WORKLOAD], raw.pod_group(min_count=1))
    assert cluster.queued() == ["ns/p0"]
    cluster.seen()
    cluster.sync("p0")
    assert cluster.api.pod("p0")["spec"]["nodeName"]

    pod = raw.pod("seed", claims={"gpu": "p0"})
    pod["metadata"]["labels"] = {model.POD_GROUP_LABEL: "train"}
    cluster.add(pod)
    cluster.sync("seed")
    assert cluster.api.condition("seed")["message"] == (
        "pod ns/seed joins PodGroup ns/train (scheduling.x-k8s.io/v1alpha1), an API the server did not serve when "
        "this scheduler started"
    )


def test_a_coscheduling_gang_past_its_timeout_says_so_and_is_still_retried() -> None:
    """Guards: scheduler-plugins' PodGroup (label, minMember): refused, its pods say the gang's line; once refused
    for longer than scheduleTimeoutSeconds they say that too, and it still binds when room appears."""
    cluster = Cluster(nodes=1, pod_group_apis=(COSCHEDULING,))
    _gang(cluster, raw.coscheduling_group(min_member=2, timeout=30), "p0", "p1")
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    assert cluster.api.condition("p0")["message"].startswith("gang ns/train (minCount 2): the cluster fits 1 of 2")
    cluster.scheduler._gang_refused_since["uid-train"] -= 31  # as if refused 31 s ago
    cluster.seen()
    cluster.sync("p0")
    assert cluster.api.condition("p1")["message"].endswith(
        "(unschedulable past its scheduleTimeoutSeconds 30; retried)"
    )
    _feed(cluster.scheduler.nodes, raw.node("n2"))
    _feed(cluster.scheduler.slices, raw.resource_slice("n2"))
    cluster.seen()
    cluster.sync("p1")
    assert sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1")) == ["n1", "n2"]


def test_a_pod_group_dractl_cannot_read_is_named_on_its_pods_with_the_field() -> None:
    """Guards: bad input: a PodGroup the model refuses (minMember 0, which a loose CRD schema lets through) is named on
    each of its pods with the field and why, not a wait for a group that "does not exist"; its pods are queued again
    when it is fixed, and then scheduled."""
    cluster = Cluster(nodes=2, pod_group_apis=(COSCHEDULING,))
    bad = raw.coscheduling_group(min_member=2)
    bad["spec"]["minMember"] = 0
    _feed(cluster.scheduler.pod_groups[COSCHEDULING], bad)
    _gang(cluster, raw.coscheduling_group(min_member=2), "p0", "p1")
    _feed(cluster.scheduler.pod_groups[COSCHEDULING], bad)
    cluster.scheduler.open_ledger()
    cluster.sync("p0")
    message = cluster.api.condition("p0")["message"]
    assert message.startswith("PodGroup ns/train (scheduling.x-k8s.io/v1alpha1) is invalid: ") and (
        "spec.minMember" in message and "must be a positive integer" in message
    ), message
    cluster.queued()
    _feed(cluster.scheduler.pod_groups[COSCHEDULING], raw.coscheduling_group(min_member=2))
    assert sorted(cluster.queued()) == ["ns/p0", "ns/p1"]
    cluster.seen()
    cluster.sync("p1")
    assert sorted(cluster.api.pod(name)["spec"]["nodeName"] for name in ("p0", "p1")) == ["n1", "n2"]
