"""What a claim needs from the claim controller: reservations dropped, deallocation, finalizer removal, deletion."""

from __future__ import annotations

import pytest
from support import controller_inputs as build

from dractl import model
from dractl.controller import claims as controller

RUNNING = build.pod("a")
OTHER = build.pod("b")


def test_a_claim_whose_pods_all_run_needs_nothing() -> None:
    """Guards: converged state (every reserving pod runs) plans no write at all."""
    claim = build.claim("shared", reserved=(build.ref(RUNNING), build.ref(OTHER)), allocated=True, finalizer=True)
    plan = controller.plan_claim(claim, {"a": RUNNING, "b": OTHER})
    assert plan.empty and plan == controller.ClaimPlan()


@pytest.mark.parametrize(
    "state",
    [
        None,
        build.pod("a", uid="new-uid"),
        build.pod("a", phase="Succeeded"),
        build.pod("a", phase="Failed"),
        build.pod("a", deleting=True),
    ],
    ids=["gone", "replaced", "succeeded", "failed", "deleted-before-scheduling"],
)
def test_an_entry_of_a_pod_that_no_longer_needs_the_claim_is_dropped(state: controller.PodState | None) -> None:
    """Guards: reservedFor loses pods that are gone, replaced (other UID), finished, or deleted while unscheduled;
    the other pod's entry stays and the claim stays allocated."""
    claim = build.claim("shared", reserved=(build.ref(RUNNING), build.ref(OTHER)), allocated=True, finalizer=True)
    plan = controller.plan_claim(claim, {"a": state, "b": OTHER})
    assert plan == controller.ClaimPlan(reserved_for=(build.ref(OTHER),))


def test_a_running_pod_being_deleted_keeps_its_entry_until_it_is_gone() -> None:
    """Guards: a bound pod with a deletion timestamp may still use the devices: its entry is kept."""
    bound = build.pod("a", node="node-a", deleting=True)
    claim = build.claim("shared", reserved=(build.ref(bound),), allocated=True, finalizer=True)
    assert controller.plan_claim(claim, {"a": bound}).empty


def test_unknown_pods_and_other_consumers_are_kept() -> None:
    """Guards: an entry whose pod was not looked up, or that is not a core pod, is never dropped."""
    other_kind = model.ResourceClaimConsumerReference(
        resource="podgroups", name="g", uid="g1", api_group="scheduling.k8s.io"
    )
    claim = build.claim("shared", reserved=(build.ref(RUNNING), other_kind), allocated=True, finalizer=True)
    assert controller.plan_claim(claim, {}).empty


def test_the_last_entry_going_deallocates_a_protected_claim_and_removes_the_finalizer() -> None:
    """Guards: reservedFor becoming empty on a claim with the delete-protection finalizer clears the allocation in
    the same status write, then removes the finalizer; a claim nobody generated is not deleted."""
    claim = build.claim("shared", reserved=(build.ref(RUNNING),), allocated=True, finalizer=True)
    plan = controller.plan_claim(claim, {"a": None})
    assert plan == controller.ClaimPlan(reserved_for=(), deallocate=True, remove_finalizer=True)


def test_a_claim_allocated_without_the_finalizer_is_never_deallocated() -> None:
    """Guards: as upstream, a claim allocated by someone else without the finalizer only loses the reservation."""
    claim = build.claim("shared", reserved=(build.ref(RUNNING),), allocated=True)
    assert controller.plan_claim(claim, {"a": None}) == controller.ClaimPlan(reserved_for=())


def test_an_allocated_claim_never_reserved_stays_allocated() -> None:
    """Guards: only the transition reserved -> unreserved deallocates (the scheduler may be about to reserve)."""
    claim = build.claim("fresh", allocated=True, finalizer=True)
    assert controller.plan_claim(claim, {}).empty


def test_a_deleted_unreserved_protected_claim_is_released() -> None:
    """Guards: a claim being deleted that nothing reserves has its allocation cleared and finalizer removed."""
    claim = build.claim("shared", allocated=True, finalizer=True, deleting=True)
    assert controller.plan_claim(claim, {}) == controller.ClaimPlan(deallocate=True, remove_finalizer=True)
    reserved = build.claim("shared", reserved=(build.ref(RUNNING),), allocated=True, finalizer=True, deleting=True)
    assert controller.plan_claim(reserved, {"a": RUNNING}).empty


def test_a_failed_finalizer_removal_is_retried() -> None:
    """Guards: after a deallocation whose finalizer removal failed, the next sync removes the finalizer."""
    claim = build.claim("shared", finalizer=True)
    assert controller.plan_claim(claim, {}).empty
    assert controller.plan_claim(claim, {}, finalizer_pending=True) == controller.ClaimPlan(remove_finalizer=True)
    allocated_again = build.claim("shared", finalizer=True, allocated=True)
    assert controller.plan_claim(allocated_again, {}, finalizer_pending=True).empty


@pytest.mark.parametrize(
    "state",
    [None, build.pod("job", uid="new-uid"), build.pod("job", phase="Succeeded"), build.pod("job", phase="Failed")],
    ids=["gone", "replaced", "succeeded", "failed"],
)
def test_a_generated_claim_is_deleted_when_its_pod_is_done(state: controller.PodState | None) -> None:
    """Guards: an unreserved claim controlled by a pod that is gone, replaced or finished is deleted."""
    job = build.pod("job")
    claim = build.claim("job-gpu-abcde", owner=job)
    assert controller.plan_claim(claim, {"job": state}) == controller.ClaimPlan(delete=True)


def test_a_generated_claim_is_kept_while_reserved_running_or_already_deleting() -> None:
    """Guards: no delete while its pod runs, while anything reserves it, or when it is already being deleted."""
    job = build.pod("job")
    assert controller.plan_claim(build.claim("c", owner=job), {"job": job}).empty
    other = build.pod("other")
    reserved = build.claim("c", owner=job, reserved=(build.ref(other),), allocated=True)
    assert controller.plan_claim(reserved, {"job": None, "other": other}).empty
    assert controller.plan_claim(build.claim("c", owner=job, deleting=True), {"job": None}).empty


def test_a_done_pods_allocated_claim_is_unreserved_deallocated_and_deleted() -> None:
    """Guards: the whole cleanup of a finished pod's generated claim is planned in one sync, in order."""
    job = build.pod("job", phase="Succeeded")
    claim = build.claim("c", owner=job, reserved=(build.ref(job),), allocated=True, finalizer=True)
    assert controller.plan_claim(claim, {"job": job}) == controller.ClaimPlan(
        reserved_for=(), deallocate=True, remove_finalizer=True, delete=True
    )


def test_a_duplicate_is_deleted_only_when_the_pod_records_another_live_claim_of_its_own() -> None:
    """Guards: an unrecorded claim made for a pod claim is deleted when the pod records another existing claim that
    it controls; never when the record is missing, names a missing claim or someone else's."""
    job = build.pod("job", recorded={"gpu": "kept"})
    duplicate = build.claim("dup", owner=job)
    kept = build.claim("kept", owner=job)
    assert controller.plan_claim(duplicate, {"job": job}, existing=build.by_name(kept, duplicate)).delete
    assert controller.plan_claim(kept, {"job": job}, existing=build.by_name(kept, duplicate)).empty
    assert controller.plan_claim(duplicate, {"job": job}, existing=build.by_name(duplicate)).empty
    unrecorded = build.pod("job")
    assert controller.plan_claim(duplicate, {"job": unrecorded}, existing=build.by_name(kept, duplicate)).empty
    foreign = build.claim("kept", owner=build.pod("job", uid="other"))
    assert controller.plan_claim(duplicate, {"job": job}, existing=build.by_name(foreign, duplicate)).empty
