"""What a pod needs from the claim controller: claims to create or adopt, status records, reservations."""

from __future__ import annotations

from support import controller_inputs as build

from dractl.controller import claims as controller
from dractl.model import limits


def test_a_pod_without_claims_gets_its_template_claim_created() -> None:
    """Guards: a template entry with no record and no claim is created from its template; direct entries are not."""
    pod = build.pod(templates={"gpu": "gpu-template"}, direct={"shared": "shared-claim"})
    plan = controller.plan_pod(pod, {})
    assert plan == controller.PodPlan(adopt={}, create=(controller.Create("gpu", "gpu-template"),))


def test_a_recorded_claim_that_exists_needs_nothing() -> None:
    """Guards: converged state: the recorded claim exists and the pod controls it -> no create, no adoption."""
    pod = build.pod(templates={"gpu": "t"}, recorded={"gpu": "trainer-gpu-abcde"})
    plan = controller.plan_pod(pod, build.by_name(build.claim("trainer-gpu-abcde", owner=pod)))
    assert plan == controller.PodPlan(adopt={}, create=())
    assert controller.status_entries(pod, plan.adopt) is None


def test_an_unrecorded_claim_made_for_the_pod_is_adopted_not_duplicated() -> None:
    """Guards: a claim controlled by the pod with the matching pod-claim-name annotation is adopted."""
    pod = build.pod(templates={"gpu": "t"})
    plan = controller.plan_pod(pod, build.by_name(build.claim("trainer-gpu-xyz12", owner=pod)))
    assert plan == controller.PodPlan(adopt={"gpu": "trainer-gpu-xyz12"}, create=())


def test_of_two_claims_made_for_one_pod_claim_the_first_by_name_is_adopted() -> None:
    """Guards: when two controllers raced, every caller picks the same claim (the first by name)."""
    pod = build.pod(templates={"gpu": "t"})
    claims = build.by_name(build.claim("trainer-gpu-zzzzz", owner=pod), build.claim("trainer-gpu-bbbbb", owner=pod))
    assert controller.plan_pod(pod, claims).adopt == {"gpu": "trainer-gpu-bbbbb"}


def test_claims_of_other_pods_other_pod_claims_or_being_deleted_are_not_adopted() -> None:
    """Guards: only a live claim controlled by this pod's UID and annotated with this pod claim is adopted."""
    pod = build.pod(templates={"gpu": "t"})
    other_pod = build.pod("trainer", uid="another-uid")
    claims = build.by_name(
        build.claim("of-replaced-pod", owner=other_pod),
        build.claim("of-other-pod-claim", owner=pod, pod_claim="fpga"),
        build.claim("being-deleted", owner=pod, deleting=True),
        build.claim("not-generated"),
    )
    assert controller.plan_pod(pod, claims) == controller.PodPlan(adopt={}, create=(controller.Create("gpu", "t"),))


def test_a_recorded_claim_that_was_deleted_is_made_again() -> None:
    """Guards: a record naming a claim that no longer exists (or is not the pod's) leads to a new claim."""
    pod = build.pod(templates={"gpu": "t"}, recorded={"gpu": "trainer-gpu-gone1"})
    assert controller.plan_pod(pod, {}).create == (controller.Create("gpu", "t"),)
    stolen = build.claim("trainer-gpu-gone1", owner=build.pod("someone-else"))
    assert controller.plan_pod(pod, build.by_name(stolen)).create == (controller.Create("gpu", "t"),)


def test_a_pod_claim_recorded_as_not_needed_is_skipped() -> None:
    """Guards: a record without a claim name (upstream's "no claim needed") is respected."""
    pod = build.pod(templates={"gpu": "t"}, recorded={"gpu": None})
    assert controller.plan_pod(pod, {}) == controller.PodPlan(adopt={}, create=())


def test_finished_or_deleted_pods_get_no_claims() -> None:
    """Guards: a pod that Succeeded, Failed or is being deleted gets nothing created."""
    for pod in (
        build.pod(templates={"gpu": "t"}, phase="Succeeded"),
        build.pod(templates={"gpu": "t"}, phase="Failed"),
        build.pod(templates={"gpu": "t"}, deleting=True),
    ):
        assert controller.plan_pod(pod, {}) == controller.PodPlan(adopt={}, create=())


def test_status_entries_add_the_new_records_and_keep_the_others_in_spec_order() -> None:
    """Guards: the status write carries the full list: existing records (others' too) kept, new ones added."""
    pod = build.pod(templates={"a": "t", "b": "t", "c": "t"}, recorded={"c": "pod-c-11111", "x": None})
    entries = controller.status_entries(pod, {"a": "pod-a-22222"})
    assert entries == [
        {"name": "a", "resourceClaimName": "pod-a-22222"},
        {"name": "c", "resourceClaimName": "pod-c-11111"},
        {"name": "x"},
    ]
    assert controller.status_entries(pod, {"c": "pod-c-11111"}) is None


def test_a_bound_pod_is_reserved_on_its_allocated_claims_only() -> None:
    """Guards: a pod bound to a node is added to allocated claims that do not list it; unallocated claims,
    claims already listing it and claims being deleted are left alone."""
    pod = build.pod(
        node="node-a",
        templates={"gen": "t"},
        recorded={"gen": "generated"},
        direct={"a": "allocated", "b": "unallocated", "c": "already", "d": "deleting", "e": "missing"},
    )
    claims = build.by_name(
        build.claim("generated", owner=pod, pod_claim="gen", allocated=True),
        build.claim("allocated", allocated=True),
        build.claim("unallocated"),
        build.claim("already", allocated=True, reserved=(build.ref(pod),)),
        build.claim("deleting", allocated=True, deleting=True),
    )
    assert controller.reservations_to_add(pod, claims) == ["generated", "allocated"]


def test_unbound_finished_or_deleted_pods_are_not_reserved() -> None:
    """Guards: reservation is only for bound pods that still run (the scheduler reserves for pods it binds)."""
    claims = build.by_name(build.claim("allocated", allocated=True))
    for pod in (
        build.pod(direct={"a": "allocated"}),
        build.pod(direct={"a": "allocated"}, node="node-a", phase="Succeeded"),
        build.pod(direct={"a": "allocated"}, node="node-a", deleting=True),
    ):
        assert controller.reservations_to_add(pod, claims) == []


def test_the_reservation_limit_is_the_apis() -> None:
    """Guards: the controller refuses to grow reservedFor past the API's limit of 256 entries."""
    assert limits.MAX_RESERVED_FOR == 256


# --- Another claim controller ------------------------------------------------------------------

USER_CREATE = {
    "manager": "kubectl",
    "operation": "Update",
    "time": "2026-11-27T04:26:46Z",
    "fieldsV1": {"f:spec": {"f:resourceClaims": {}}},
}


def _raw_pod(*managed: dict[str, object]) -> dict[str, object]:
    """A pod as kube-controller-manager 1.36.2 leaves it (its managedFields as read from a real one)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "managedFields": list(managed)},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-ppvd7"}]},
    }


def test_who_recorded_the_claims_is_read_from_the_managed_fields() -> None:
    """Guards: only entries owning status.resourceClaimStatuses count, with their manager and time; odd entries are
    ignored, not a crash."""
    pod = controller.decode_pod(_raw_pod(build.KCM_APPLY, USER_CREATE, {"manager": 3}, "junk"))  # type: ignore[arg-type]
    assert pod is not None
    assert pod.claim_status_writers == {("ResourceClaimController", "2026-11-27T04:26:50Z")}


def test_another_managers_new_or_newer_write_of_the_claim_statuses_is_another_controller() -> None:
    """Guards: kube-controller-manager's apply on a pod seen without it (or with an older one) is reported; dractl's
    own write, an unchanged entry and an entry that went away are not."""
    before = controller.decode_pod(_raw_pod(USER_CREATE))
    after = controller.decode_pod(_raw_pod(USER_CREATE, build.KCM_APPLY))
    later = controller.decode_pod(_raw_pod(USER_CREATE, {**build.KCM_APPLY, "time": "2026-11-27T05:00:00Z"}))
    ours = controller.decode_pod(_raw_pod(USER_CREATE, {**build.KCM_APPLY, "manager": "dractl", "operation": "Update"}))
    assert before is not None and after is not None and later is not None and ours is not None
    assert controller.other_claim_writer(before, after, ours="dractl") == "ResourceClaimController"
    assert controller.other_claim_writer(None, after, ours="dractl") == "ResourceClaimController"
    assert controller.other_claim_writer(after, later, ours="dractl") == "ResourceClaimController"
    assert controller.other_claim_writer(after, after, ours="dractl") is None
    assert controller.other_claim_writer(after, before, ours="dractl") is None
    assert controller.other_claim_writer(before, ours, ours="dractl") is None
