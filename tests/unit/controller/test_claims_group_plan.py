"""What PodGroup claims need from the claim controller (as kube-controller-manager 1.36 does): one claim per group
entry, members recording it, reservations for the group, release once the group is gone."""

from __future__ import annotations

from support import controller_inputs as build

from dractl.controller import claims as controller


def test_a_member_of_a_group_that_does_not_exist_gets_nothing() -> None:
    """Guards: as upstream, none of a member's claims are made (not even its own) until its PodGroup exists."""
    pod = build.pod(templates={"shared": "t", "own": "t"}, group="train")
    assert controller.plan_pod(pod, {}, group=None) == controller.PodPlan(adopt={}, create=())


def test_a_member_records_the_groups_claim_and_gets_claims_of_its_own_for_other_entries() -> None:
    """Guards: an entry equal to the group's records the claim the group records (never made for the pod); the
    pod's other template entries get their own claims; before the group records one, the entry waits."""
    pod = build.pod(templates={"shared": "t", "own": "t"}, group="train")
    waiting = build.group(templates={"shared": "t"})
    assert controller.plan_pod(pod, {}, group=waiting) == controller.PodPlan(
        adopt={}, create=(controller.Create("own", "t"),)
    )
    made = build.group(templates={"shared": "t"}, recorded={"shared": "train-shared-abcde"})
    assert controller.plan_pod(pod, {}, group=made) == controller.PodPlan(
        adopt={"shared": "train-shared-abcde"}, create=(controller.Create("own", "t"),)
    )
    converged = build.pod(templates={"shared": "t"}, group="train", recorded={"shared": "train-shared-abcde"})
    assert controller.plan_pod(converged, {}, group=made) == controller.PodPlan(adopt={}, create=())


def test_an_entry_that_differs_from_the_groups_gets_a_claim_of_its_own() -> None:
    """Guards: the match is on every field (name and template): the same name with another template is the pod's
    own claim, as upstream."""
    pod = build.pod(templates={"shared": "other-template"}, group="train")
    group = build.group(templates={"shared": "t"}, recorded={"shared": "train-shared-abcde"})
    assert controller.plan_pod(pod, {}, group=group) == controller.PodPlan(
        adopt={}, create=(controller.Create("shared", "other-template"),)
    )


def test_a_group_gets_one_claim_per_template_entry_adopts_its_own_and_none_while_deleted() -> None:
    """Guards: a group's template entry without a claim is created, named entries are not; a claim controlled by
    the group with the entry's annotation is adopted (a pod's is not); a recorded claim it controls needs nothing;
    a group being deleted needs nothing."""
    group = build.group(templates={"shared": "t"}, direct={"named": "c"})
    assert controller.plan_group(group, {}) == controller.PodPlan(adopt={}, create=(controller.Create("shared", "t"),))
    pods_claim = build.claim("train-shared-xxxxx", owner=build.pod("train", uid="uid-train"), pod_claim="shared")
    assert controller.plan_group(group, build.by_name(pods_claim)).create == (controller.Create("shared", "t"),)
    own = build.claim("train-shared-abcde", owner=group, pod_claim="shared")
    assert controller.plan_group(group, build.by_name(own)) == controller.PodPlan(
        adopt={"shared": "train-shared-abcde"}, create=()
    )
    recorded = build.group(templates={"shared": "t"}, recorded={"shared": "train-shared-abcde"})
    assert controller.plan_group(recorded, build.by_name(own)) == controller.PodPlan(adopt={}, create=())
    deleting = build.group(templates={"shared": "t"}, deleting=True)
    assert controller.plan_group(deleting, {}) == controller.PodPlan(adopt={}, create=())


def test_a_bound_members_group_claims_are_reserved_for_the_group_not_the_pod() -> None:
    """Guards: allocated claims of the group (recorded or named) used by a bound member are reserved for the
    PodGroup and never for the pod; the pod's own claims are reserved for the pod; a pod of a missing group gets
    no reservation."""
    group = build.group(templates={"shared": "t"}, direct={"named": "c-named"}, recorded={"shared": "g-claim"})
    pod = build.pod(
        templates={"shared": "t", "own": "t"},
        direct={"named": "c-named"},
        group="train",
        node="node-a",
        recorded={"shared": "g-claim", "own": "p-claim"},
    )
    claims = build.by_name(
        build.claim("g-claim", owner=group, pod_claim="shared", allocated=True),
        build.claim("c-named", allocated=True),
        build.claim("p-claim", owner=pod, pod_claim="own", allocated=True),
    )
    assert controller.reservations_to_add(pod, claims, group=group) == ["p-claim"]
    assert controller.group_reservations_to_add(pod, group, claims) == ["g-claim", "c-named"]
    reserved = build.by_name(build.claim("g-claim", owner=group, allocated=True, reserved=(build.ref(group),)))
    assert controller.group_reservations_to_add(pod, group, reserved) == []
    assert controller.reservations_to_add(pod, claims, group=None) == []
    assert controller.group_consumer(group) == {
        "apiGroup": "scheduling.k8s.io",
        "resource": "podgroups",
        "name": "train",
        "uid": "uid-train",
    }


def test_a_group_reservation_ends_when_the_group_is_gone_or_replaced_not_while_it_is_deleted() -> None:
    """Guards: a `podgroups` entry is dropped (and the claim deallocated and unprotected) when its group is gone or
    has another UID; kept while the group is being deleted, when the group is unknown, or when PodGroups are not
    served; the claim, owned by the group, is never deleted for it (the garbage collector does that)."""
    group = build.group(templates={"shared": "t"}, recorded={"shared": "g-claim"})
    claim = build.claim(
        "g-claim", owner=group, pod_claim="shared", allocated=True, finalizer=True, reserved=(build.ref(group),)
    )
    released = controller.ClaimPlan(reserved_for=(), deallocate=True, remove_finalizer=True)
    assert controller.plan_claim(claim, {}, groups={"train": None}) == released
    assert controller.plan_claim(claim, {}, groups={"train": build.group(uid="another")}) == released
    assert controller.plan_claim(claim, {}, groups={"train": build.group(deleting=True)}).empty
    assert controller.plan_claim(claim, {}, groups={}).empty
    assert controller.plan_claim(claim, {}, groups=None).empty
    assert controller.plan_claim(claim, {}, groups={"train": group}).empty


def test_a_duplicate_claim_of_a_group_is_deleted_the_recorded_one_kept() -> None:
    """Guards: a claim controlled by the group that is not the one the group records (which exists and the group
    controls) is deleted as a duplicate of a race; the recorded one is kept."""
    group = build.group(templates={"shared": "t"}, recorded={"shared": "train-shared-aaaaa"})
    recorded = build.claim("train-shared-aaaaa", owner=group, pod_claim="shared")
    duplicate = build.claim("train-shared-bbbbb", owner=group, pod_claim="shared")
    existing = build.by_name(recorded, duplicate)
    assert controller.plan_claim(duplicate, {}, groups={"train": group}, existing=existing).delete
    assert controller.plan_claim(recorded, {}, groups={"train": group}, existing=existing).empty


def test_the_group_claim_body_is_owned_by_the_group_without_blocking_its_deletion() -> None:
    """Guards: generateName `<group>-<entry>-`, the template's metadata plus the pod-claim-name annotation, and a
    controller reference to the PodGroup without blockOwnerDeletion (upstream's)."""
    group = build.group(templates={"shared": "t"})
    template = {"spec": {"metadata": {"labels": {"a": "b"}}, "spec": {"devices": {}}}}
    body = controller.group_claim_body(group, pod_claim_name="shared", template=template)
    assert body["metadata"] == {
        "generateName": "train-shared-",
        "namespace": "ns",
        "labels": {"a": "b"},
        "annotations": {"resource.kubernetes.io/pod-claim-name": "shared"},
        "ownerReferences": [
            {
                "apiVersion": "scheduling.k8s.io/v1alpha2",
                "kind": "PodGroup",
                "name": "train",
                "uid": "uid-train",
                "controller": True,
            }
        ],
    }
    assert body["spec"] == {"devices": {}}


def test_a_raw_pod_group_decodes_with_its_records_and_their_writers() -> None:
    """Guards: decode_group reads the spec's claims, status.resourceClaimStatuses and who wrote them, so another
    controller's record in a PodGroup is seen (kube-controller-manager's is an Apply as ResourceClaimController);
    a PodGroup the model refuses is skipped."""
    raw = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "9",
            "managedFields": [{**build.KCM_APPLY, "apiVersion": "scheduling.k8s.io/v1alpha2"}],
        },
        "spec": {
            "schedulingPolicy": {"basic": {}},
            "resourceClaims": [{"name": "shared", "resourceClaimTemplateName": "t"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "shared", "resourceClaimName": "train-shared-abcde"}]},
    }
    group = controller.decode_group(raw)
    assert group is not None
    assert group.claim_statuses == {"shared": "train-shared-abcde"}
    assert group.group.resource_claims[0].resource_claim_template_name == "t"
    assert controller.other_claim_writer(None, group, ours="dractl") == "ResourceClaimController"
    assert controller.decode_group({**raw, "spec": {"schedulingPolicy": {}}}) is None
