"""The scheduler's pure decisions (`controller.schedplan`): reading pods, resolving and splitting claims, node
filtering with allocated claims, the unschedulable message, and every body the scheduler writes."""

from __future__ import annotations

from typing import Any

import pytest
from support import scheduler_inputs as raw

from dractl import alloc, model
from dractl.controller import nodefit, schedplan
from dractl.kube import client


def info(body: dict[str, Any], *, scheduler: str = "dractl") -> schedplan.PodInfo:
    decoded = schedplan.decode_pod(body, scheduler_name=scheduler)
    assert decoded is not None
    return decoded


def claim(name: str, **kwargs: Any) -> model.ResourceClaim:
    value = client.decode(raw.claim(name, **kwargs), strict=True)
    assert isinstance(value, model.ResourceClaim)
    return value


def by_name(*claims: model.ResourceClaim) -> dict[str, model.ResourceClaim]:
    return {item.meta.name: item for item in claims}


# --- reading pods ----------------------------------------------------------------------------


def test_a_pending_pod_of_this_scheduler_has_its_node_requirements() -> None:
    """Guards: an unbound pod of this scheduler is pending and carries what the node filter reads."""
    pod = info(raw.pod(cpu="1500m"))
    assert pod.pending_for("dractl") and not pod.pending_for("other")
    assert pod.needs is not None and pod.needs.cpu_milli == 1500
    assert pod.invalid is None and schedplan.unsupported_message(pod) is None


def test_another_schedulers_unbound_pod_is_not_read_further_and_a_bound_one_counts_on_its_node() -> None:
    """Guards: requirements are read only where they matter: not for another scheduler's unbound pod, but for any
    bound pod (its requests use its node)."""
    assert info(raw.pod(scheduler="default-scheduler")).needs is None
    bound = info(raw.pod(scheduler="default-scheduler", node="n1"))
    assert bound.needs is not None and bound.uses_node and not bound.pending_for("dractl")


def test_a_finished_bound_pod_does_not_use_its_node() -> None:
    """Guards: a bound pod in phase Succeeded leaves its node's usage."""
    body = raw.pod(node="n1")
    body["status"]["phase"] = "Succeeded"
    assert not info(body).uses_node


def test_a_pod_whose_requests_do_not_parse_is_invalid_with_the_field_named() -> None:
    """Guards: bad input on our pod becomes a message naming the pod and the field, not an exception."""
    pod = info(raw.pod(cpu="abc"))
    message = schedplan.unsupported_message(pod)
    assert message is not None and "cpu" in message and "resources" in message
    assert pod.pending_for("dractl")


def test_a_pod_the_model_refuses_is_still_reported_when_it_is_ours() -> None:
    """Guards: a pod of this scheduler that the model cannot decode comes back invalid (naming the pod), and the
    same pod of another scheduler is skipped."""
    body = raw.pod(claims={"gpu": "c"})
    body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "t"  # both names: the API refuses it too
    pod = info(body)
    assert pod.invalid is not None and "ns/trainer" in pod.invalid
    assert (
        schedplan.decode_pod({**body, "spec": {**body["spec"], "schedulerName": "x"}}, scheduler_name="dractl") is None
    )


def test_inter_pod_anti_affinity_is_reported_not_ignored() -> None:
    """Guards: a required podAntiAffinity makes the pod refused with a message naming the field."""
    term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
    pod = info(raw.pod(affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}))
    message = schedplan.unsupported_message(pod)
    assert message is not None and "podAntiAffinity" in message and "spec.schedulerName" in message


def test_the_pod_scheduled_condition_is_read() -> None:
    """Guards: the current PodScheduled condition is compared without its timestamps."""
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
    pod = info(raw.pod(conditions=[{"type": "Ready", "status": "False"}, {**condition, "lastTransitionTime": "t"}]))
    assert pod.scheduled == schedplan.Condition(status="False", reason="Unschedulable", message="m")


# --- claims ----------------------------------------------------------------------------------


def test_claims_resolve_in_pod_order_named_and_generated() -> None:
    """Guards: a direct claim and a recorded generated claim (controlled by the pod) resolve; a pod claim recorded
    as not needed is skipped; a claim named twice counts once."""
    pod = info(
        raw.pod(
            claims={"a": "shared", "b": "shared"},
            templates={"gen": "tpl", "skip": "tpl"},
            recorded={"gen": "trainer-gen-x", "skip": None},
        )
    )
    resolved = schedplan.resolve_claims(pod, by_name(claim("shared"), claim("trainer-gen-x", owner="trainer")))
    assert resolved.waiting is None and resolved.problem is None
    assert [c.meta.name for c in resolved.claims] == ["shared", "trainer-gen-x"]


@pytest.mark.parametrize(
    ("body", "claims", "expected"),
    [
        pytest.param(raw.pod(claims={"gpu": "missing"}), (), "ns/missing", id="named-claim-missing"),
        pytest.param(raw.pod(templates={"gpu": "tpl"}), (), "pod claim gpu to be created", id="template-not-recorded"),
        pytest.param(
            raw.pod(templates={"gpu": "tpl"}, recorded={"gpu": "made"}), (), "ns/made", id="recorded-claim-missing"
        ),
    ],
)
def test_a_pod_waits_for_claims_that_do_not_exist_yet(
    body: dict[str, Any], claims: tuple[model.ResourceClaim, ...], expected: str
) -> None:
    """Guards: a missing claim (named, not yet made from its template, or recorded but not in the cache) means
    waiting, with the claim named."""
    resolved = schedplan.resolve_claims(info(body), by_name(*claims))
    assert resolved.waiting is not None and expected in resolved.waiting
    assert resolved.problem is None and resolved.claims == ()


def test_a_claim_being_deleted_means_waiting() -> None:
    """Guards: a claim with a deletionTimestamp is not used (kube-scheduler's PreEnqueue)."""
    body = raw.claim("going")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    going = client.decode(body, strict=True)
    assert isinstance(going, model.ResourceClaim)
    resolved = schedplan.resolve_claims(info(raw.pod(claims={"gpu": "going"})), by_name(going))
    assert resolved.waiting is not None and "being deleted" in resolved.waiting


def test_a_generated_claim_of_another_pod_and_an_invalid_claim_are_problems() -> None:
    """Guards: a recorded claim the pod does not control, and a claim the model refuses, are reported (with the pod's
    field), not waited for."""
    pod = info(raw.pod(templates={"gpu": "tpl"}, recorded={"gpu": "foreign"}))
    resolved = schedplan.resolve_claims(pod, by_name(claim("foreign", owner="someone-else")))
    assert resolved.problem is not None and "spec.resourceClaims[gpu]" in resolved.problem
    bad = schedplan.resolve_claims(info(raw.pod(claims={"gpu": "bad"})), {}, bad={"bad": "spec.devices: wrong"})
    assert bad.problem is not None and "ns/bad" in bad.problem and "spec.devices: wrong" in bad.problem


def test_claims_split_into_allocated_to_reserve_and_to_allocate() -> None:
    """Guards: an allocated claim already reserved for the pod only pins; one not reserved is also to reserve; an
    unallocated one is to allocate."""
    pod = info(raw.pod())
    mine = claim("mine", allocated_on="n1", reserved=("trainer",))
    shared = claim("shared", allocated_on="n1", reserved=("other",))
    fresh = claim("fresh")
    split = schedplan.split_claims(pod, [mine, shared, fresh])
    assert [c.meta.name for c in split.allocated] == ["mine", "shared"]
    assert [c.meta.name for c in split.reserve] == ["shared"]
    assert [c.meta.name for c in split.allocate] == ["fresh"]
    assert split.problem is None


def test_a_claim_with_256_reservations_cannot_take_the_pod() -> None:
    """Guards: reservedFor is limited to 256 entries; the pod is refused naming the claim."""
    full = claim("full", allocated_on="n1", reserved=tuple(f"p{i}" for i in range(256)))
    split = schedplan.split_claims(info(raw.pod()), [full])
    assert split.problem is not None and "ns/full" in split.problem and "256" in split.problem


# --- nodes -----------------------------------------------------------------------------------


def test_an_allocated_claim_pins_the_node() -> None:
    """Guards: nodes outside an allocated claim's node selector are refused with upstream's reason."""
    pod = info(raw.pod())
    assert pod.needs is not None
    nodes = [nodefit.NodeInfo.from_raw(raw.node(name)) for name in ("n1", "n2", "n3")]
    feasible, reasons = schedplan.feasible_nodes(
        pod.needs, nodes, used={}, allocated=[claim("pinned", allocated_on="n2")]
    )
    assert feasible == ["n2"]
    assert reasons == {"n1": schedplan.CLAIM_NOT_ON_NODE, "n3": schedplan.CLAIM_NOT_ON_NODE}


def test_node_usage_refuses_a_node_without_room() -> None:
    """Guards: the pods bound to a node use its CPUs (nodefit), so a node without room is refused."""
    pod = info(raw.pod(cpu="6"))
    assert pod.needs is not None
    nodes = [nodefit.NodeInfo.from_raw(raw.node(name)) for name in ("n1", "n2")]
    used = {"n1": nodefit.usage([pod.needs])}
    feasible, reasons = schedplan.feasible_nodes(pod.needs, nodes, used=used)
    assert feasible == ["n2"] and reasons == {"n1": "Insufficient cpu"}


def test_the_unschedulable_message_has_the_node_summary_and_the_allocators_reasons() -> None:
    """Guards: kube-scheduler's "0/N nodes are available" summary first, then each claim's explanation once."""
    reason = alloc.Reason(claim="ns/c", request="gpu", message="needs 4 devices, 2 match")
    message = schedplan.unschedulable_message(
        node_reasons={"n1": schedplan.CANNOT_ALLOCATE, "n2": "Insufficient cpu"}, total=2, outcome=[reason, reason]
    )
    assert message == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 cannot allocate all claims. "
        "ResourceClaim ns/c request gpu: needs 4 devices, 2 match"
    )


# --- writes ----------------------------------------------------------------------------------

ALLOCATION = model.AllocationResult(
    results=(model.DeviceRequestAllocationResult(request="gpu", driver=raw.DRIVER, pool="n1", device="gpu-1"),)
)


def test_the_finalizer_is_needed_only_where_it_is_missing() -> None:
    """Guards: a claim with other finalizers still needs the delete-protection one, a claim with it does not."""
    body = raw.claim("c")
    body["metadata"]["finalizers"] = ["other"]
    plain = client.decode(body, strict=True)
    assert isinstance(plain, model.ResourceClaim)
    assert schedplan.needs_finalizer(plain)
    assert not schedplan.needs_finalizer(claim("c", finalizer=True))


def test_the_allocation_patch_writes_the_allocation_and_reserves_the_pod() -> None:
    """Guards: status.allocation in the API's shape and the pod appended to reservedFor, at the given version."""
    patch = schedplan.allocation_patch(claim("c"), ALLOCATION, info(raw.pod()), resource_version="9")
    assert patch == {
        "metadata": {"resourceVersion": "9"},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": raw.DRIVER, "pool": "n1", "device": "gpu-1"}]}
            },
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "uid-trainer"}],
        },
    }


def test_a_reservation_keeps_the_other_consumers() -> None:
    """Guards: adding the pod to a shared claim keeps the entries already there, with the claim's version."""
    patch = schedplan.reservation_patch(claim("s", allocated_on="n1", reserved=("other",)), info(raw.pod()))
    assert patch == {
        "metadata": {"resourceVersion": "3"},
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "other", "uid": "uid-other"},
                {"resource": "pods", "name": "trainer", "uid": "uid-trainer"},
            ]
        },
    }


ONLY_TRAINER = claim("c", allocated_on="n1", reserved=("trainer",), finalizer=True)
WITH_OTHER = claim("c", allocated_on="n1", reserved=("other", "trainer"), finalizer=True)
DEALLOCATE = {"allocation": None, "reservedFor": None, "devices": None}
KEEP_OTHER = schedplan.Undo(status={"reservedFor": [{"resource": "pods", "name": "other", "uid": "uid-other"}]})


@pytest.mark.parametrize(
    ("live", "allocated_here", "finalizer_added", "expected"),
    [
        pytest.param(
            ONLY_TRAINER,
            True,
            True,
            schedplan.Undo(status=DEALLOCATE, remove_finalizer=True, deallocates=True),
            id="allocated-here-only-consumer",
        ),
        pytest.param(
            ONLY_TRAINER,
            True,
            False,
            schedplan.Undo(status=DEALLOCATE, deallocates=True),
            id="finalizer-was-there-before",
        ),
        pytest.param(WITH_OTHER, True, True, KEEP_OTHER, id="someone-else-reserved-it-meanwhile"),
        pytest.param(WITH_OTHER, False, False, KEEP_OTHER, id="reservation-only"),
        pytest.param(
            claim("c", finalizer=True),
            True,
            True,
            schedplan.Undo(remove_finalizer=True),
            id="allocation-never-landed",
        ),
        pytest.param(claim("c"), True, True, schedplan.Undo(), id="nothing-landed"),
    ],
)
def test_undo_takes_back_exactly_what_this_pod_added(
    live: model.ResourceClaim, allocated_here: bool, finalizer_added: bool, expected: schedplan.Undo
) -> None:
    """Guards: the rollback of one claim: the pod's entry always, the allocation only when this decision made it
    and nobody else reserves it, the finalizer only when this decision added it and nothing stays allocated."""
    assert schedplan.undo(live, "uid-trainer", allocated_here=allocated_here, finalizer_added=finalizer_added) == (
        expected
    )


def test_the_condition_patch_sets_unschedulable_once_and_keeps_other_conditions() -> None:
    """Guards: the PodScheduled condition is written with the pod's version and the other conditions kept; the same
    message again writes nothing; a new message keeps the first transition time."""
    pod = info(raw.pod(conditions=[{"type": "Ready", "status": "False"}]))
    patch = schedplan.condition_patch(pod, "no room", now="2026-11-23T10:00:00Z")
    assert patch == {
        "metadata": {"resourceVersion": "5"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "no room",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-11-23T10:00:00Z",
                },
            ]
        },
    }
    written = info(raw.pod(conditions=patch["status"]["conditions"]))
    assert schedplan.condition_patch(written, "no room", now="later") is None
    again = schedplan.condition_patch(written, "still no room", now="later")
    assert again is not None
    assert again["status"]["conditions"][1]["lastTransitionTime"] == "2026-11-23T10:00:00Z"


def test_a_failed_attempt_replaces_the_condition_with_a_scheduler_error() -> None:
    """Guards: a failed write is reported as PodScheduled=False/SchedulerError, replacing an earlier Unschedulable
    (same message, other reason: still a write), and the same failure again writes nothing."""
    refused = info(
        raw.pod(
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "boom",
                    "lastTransitionTime": "t0",
                }
            ]
        )
    )
    patch = schedplan.condition_patch(refused, "boom", now="t1", reason=schedplan.SCHEDULER_ERROR)
    assert patch is not None
    [condition] = patch["status"]["conditions"]
    assert (condition["reason"], condition["message"], condition["lastTransitionTime"]) == (
        "SchedulerError",
        "boom",
        "t0",
    )
    failed = info(raw.pod(conditions=patch["status"]["conditions"]))
    assert schedplan.condition_patch(failed, "boom", now="t2", reason=schedplan.SCHEDULER_ERROR) is None


def test_the_binding_names_the_pod_its_uid_its_version_and_the_node() -> None:
    """Guards: the core/v1 Binding body (the UID makes a replaced pod of the same name refuse it, the version a pod
    changed since it was read)."""
    assert schedplan.binding(info(raw.pod()), "n1", resource_version="12") == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "trainer", "namespace": "ns", "uid": "uid-trainer", "resourceVersion": "12"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }


DECIDED = info(raw.pod(claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": "trainer-gpu-a"}))


@pytest.mark.parametrize(
    ("live", "problem"),
    [
        pytest.param(
            raw.pod(claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": "trainer-gpu-a"}),
            None,
            id="unchanged",
        ),
        pytest.param(
            raw.pod(claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": "trainer-gpu-b"}),
            "pod ns/trainer records trainer-gpu-b for spec.resourceClaims[gpu] now, not trainer-gpu-a",
            id="another-claim-recorded",
        ),
        pytest.param(
            raw.pod(claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": None}),
            "pod ns/trainer records no claim for spec.resourceClaims[gpu] now, not trainer-gpu-a",
            id="recorded-as-not-needed",
        ),
        pytest.param(
            raw.pod(
                claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": "trainer-gpu-a"}, node="n2"
            ),
            "pod ns/trainer is already bound to node n2",
            id="bound-meanwhile",
        ),
        pytest.param(None, "pod ns/trainer can no longer be read", id="unreadable"),
    ],
)
def test_the_pod_read_before_binding_must_record_the_claims_it_was_scheduled_with(
    live: dict[str, Any] | None, problem: str | None
) -> None:
    """Guards: the live pod voids the decision when it records another claim (or none) for a pod claim, is bound
    already or cannot be read; the same records let it be bound."""
    found = schedplan.changed_since(DECIDED.state, None if live is None else info(live).state)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_a_replaced_or_deleted_pod_voids_the_decision() -> None:
    """Guards: another UID under the same name, or a deletion timestamp, is never bound with the old decision."""
    replaced = raw.pod(claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": "trainer-gpu-a"})
    replaced["metadata"]["uid"] = "uid-new"
    assert schedplan.changed_since(DECIDED.state, info(replaced).state) == (
        "pod ns/trainer was replaced (UID uid-new, not uid-trainer)"
    )
    deleting = raw.pod(claims={"data": "shared"}, templates={"gpu": "one-gpu"}, recorded={"gpu": "trainer-gpu-a"})
    deleting["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    assert schedplan.changed_since(DECIDED.state, info(deleting).state) == "pod ns/trainer is being deleted"


def test_only_a_new_condition_or_version_is_no_reason_to_schedule_again() -> None:
    """Guards: the scheduler's own PodScheduled write (a new condition and resourceVersion) does not count as a
    change of the pod (it would undo a failed attempt's backoff), a newly recorded claim does."""
    before = info(raw.pod(templates={"gpu": "one-gpu"}))
    condition = [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": "boom"}]
    written = info(raw.pod(templates={"gpu": "one-gpu"}, conditions=condition, version="6"))
    recorded = info(raw.pod(templates={"gpu": "one-gpu"}, recorded={"gpu": "c"}, conditions=condition, version="7"))
    assert not schedplan.scheduling_changed(before, written)
    assert schedplan.scheduling_changed(written, recorded)
