"""What kube-controller-manager 1.36.2's resourceclaim controller does with a PodGroup's claims
(`scheduling.k8s.io/v1alpha2` `spec.resourceClaims`, gate DRAWorkloadResourceClaims): the behaviour dractl's
claim controller copies, recorded against the real components so that a change upstream shows here.

kube-controller-manager runs with every controller (the `upstream` fixture), kube-scheduler too; the pods name a
scheduler nobody runs, or a node, so that the tests play the scheduler.
"""

from __future__ import annotations

from typing import Any

import controlplane
import pytest
from support import kube_objects

from dractl.kube import client
from dractl.model import podclaims

pytestmark = pytest.mark.timeout(180)

SHARED = {"name": "shared", "resourceClaimTemplateName": "gpu-template"}
FINALIZER = "resource.kubernetes.io/delete-protection"


def group_records(api: client.Client, namespace: str, name: str) -> dict[str, str]:
    """The PodGroup's status.resourceClaimStatuses as {entry name: claim name}."""
    status = api.get(client.POD_GROUPS, name, namespace=namespace).get("status") or {}
    return {entry["name"]: entry.get("resourceClaimName", "") for entry in status.get("resourceClaimStatuses") or ()}


def pod_records(api: client.Client, namespace: str, name: str) -> dict[str, str]:
    status = api.get(client.PODS, name, namespace=namespace).get("status") or {}
    return {entry["name"]: entry.get("resourceClaimName", "") for entry in status.get("resourceClaimStatuses") or ()}


def claims(api: client.Client, namespace: str) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in api.list(client.RESOURCE_CLAIMS, namespace=namespace).items}


def test_upstream_makes_one_claim_per_pod_group_records_it_in_the_group_and_its_pods(
    upstream: object, kube_client: client.Client, namespace: str
) -> None:
    """Guards (upstream's protocol): a PodGroup's template claim is made once the group exists, before any pod, as
    generateName `<group>-<entry>-` with the pod-claim-name annotation, the template's labels and a
    controller owner reference to the PodGroup without blockOwnerDeletion; the group's
    status.resourceClaimStatuses records it (server-side apply as ResourceClaimController); a member pod whose entry
    repeats the group's records that same claim and gets no claim of its own for it; a pod of a group that does not
    exist yet gets none of its claims while the group is missing (its sync fails and is retried with backoff)."""
    kube_client.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        kube_objects.template(
            # No annotations: kube-controller-manager 1.36.2 writes the pod-claim-name annotation into the template's
            # annotation map it shares between claims made at once, so a group claim made beside a pod's can carry
            # the pod's entry name (seen here once: `train-shared-...` annotated `own`).
            "gpu-template",
            namespace=namespace,
            claim_metadata={"labels": {"team": "ml"}},
        ),
    )
    own = kube_objects.from_template("gpu-template", pod_claim="own")
    kube_client.create(
        client.PODS, kube_objects.group_member("early", namespace=namespace, group="train", claims=[SHARED, own])
    )
    kube_client.create(
        client.PODS, kube_objects.pod("plain", namespace=namespace, claims=[own], schedulerName="nobody")
    )
    controlplane.wait_until(lambda: pod_records(kube_client, namespace, "plain"), what="the plain pod's claim")
    assert pod_records(kube_client, namespace, "early") == {}, "a pod of a missing group waits for it"

    group = kube_client.create(client.POD_GROUPS, kube_objects.pod_group("train", namespace=namespace, claims=[SHARED]))
    recorded = controlplane.wait_until(
        lambda: group_records(kube_client, namespace, "train").get("shared"), what="the group records its claim"
    )
    claim = claims(kube_client, namespace)[recorded]
    meta = claim["metadata"]
    assert meta["generateName"] == "train-shared-"
    assert meta["annotations"] == {podclaims.POD_CLAIM_NAME_ANNOTATION: "shared"}
    assert meta["labels"] == {"team": "ml"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "name": "train",
            "uid": group["metadata"]["uid"],
            "controller": True,
        }
    ]
    stored = kube_client.get(client.POD_GROUPS, "train", namespace=namespace)
    writers = {
        (entry["manager"], entry["operation"], entry.get("subresource"))
        for entry in stored["metadata"]["managedFields"]
        if "f:resourceClaimStatuses" in (entry.get("fieldsV1") or {}).get("f:status", {})
    }
    assert writers == {("ResourceClaimController", "Apply", "status")}

    # A member created once the group records its claim records that claim for its matching entry. (What the
    # early member ends with is left out: kube-controller-manager 1.36.2 retries a member of a missing group with
    # growing backoff, and one synced between the group's creation and its record was seen to keep one of its two
    # entries unrecorded for over a minute, whichever of them, even when the pod changed.)
    kube_client.create(
        client.PODS, kube_objects.group_member("late", namespace=namespace, group="train", claims=[SHARED, own])
    )

    def both() -> dict[str, str] | None:
        found = pod_records(kube_client, namespace, "late")
        return found if len(found) == 2 else None

    records = controlplane.wait_until(both, what="the late member records both claims")
    assert records["shared"] == recorded and records["own"] != recorded
    owners = {name: c["metadata"]["ownerReferences"][0]["name"] for name, c in claims(kube_client, namespace).items()}
    assert sorted(name for name, owner in owners.items() if owner == "late") == [records["own"]]
    assert sorted(name for name, owner in owners.items() if owner == "train") == [recorded]


def test_upstream_reserves_a_group_claim_for_the_group_and_releases_it_when_the_group_is_gone(
    upstream: object, kube_client: client.Client, namespace: str
) -> None:
    """Guards (upstream's split): for a member pod bound to a node, the resourceclaim controller reserves the
    group's allocated claim for the PodGroup (`scheduling.k8s.io` `podgroups` entry, not the pod); once the
    PodGroup is gone the reservation is dropped, the claim deallocated and unprotected, and the claim (owned by the
    PodGroup) is deleted."""
    kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("gpu-template", namespace=namespace))
    group = kube_client.create(client.POD_GROUPS, kube_objects.pod_group("train", namespace=namespace, claims=[SHARED]))
    name = controlplane.wait_until(
        lambda: group_records(kube_client, namespace, "train").get("shared"), what="the group records its claim"
    )
    stored = kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace)
    stored["metadata"]["finalizers"] = [FINALIZER]
    stored = kube_client.update(client.RESOURCE_CLAIMS, stored)
    kube_client.update_status(
        client.RESOURCE_CLAIMS, {**stored, "status": {"allocation": kube_objects.allocation("node-a", ["gpu-0"])}}
    )
    kube_client.create(
        client.PODS,
        kube_objects.group_member("bound", namespace=namespace, group="train", claims=[SHARED], nodeName="node-a"),
    )
    entry = kube_objects.group_reference(group)
    controlplane.wait_until(
        lambda: (
            (kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace).get("status") or {}).get("reservedFor")
            == [entry]
        ),
        what="the claim is reserved for the PodGroup",
    )
    kube_client.delete(client.POD_GROUPS, "train", namespace=namespace)
    # Its protection finalizer stays while a pod joins it (no kubelet ends the member here): take it off.
    kube_client.patch(client.POD_GROUPS, "train", namespace=namespace, patch={"metadata": {"finalizers": None}})
    controlplane.wait_until(lambda: name not in claims(kube_client, namespace), what="the group's claim is deleted")


def test_upstreams_claim_controller_releases_a_gone_groups_claim_but_leaves_deleting_it_to_the_collector(
    control_plane: controlplane.ControlPlane, kube_client: client.Client, namespace: str
) -> None:
    """Guards (upstream's split, which dractl copies): with only the resourceclaim controller running (no garbage
    collector, no PodGroup protection), once a PodGroup is gone the reservation for it is dropped, the claim
    deallocated and unprotected, and the claim itself is not deleted (the garbage collector does that: see the
    test above)."""
    components = control_plane.start_components(only_controllers=["resource-claim-controller"])
    try:
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("gpu-template", namespace=namespace))
        group = kube_client.create(
            client.POD_GROUPS, kube_objects.pod_group("train", namespace=namespace, claims=[SHARED])
        )
        name = controlplane.wait_until(
            lambda: group_records(kube_client, namespace, "train").get("shared"), what="the group records its claim"
        )
        stored = kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace)
        stored["metadata"]["finalizers"] = [FINALIZER]
        stored = kube_client.update(client.RESOURCE_CLAIMS, stored)
        status = {
            "allocation": kube_objects.allocation("node-a", ["gpu-0"]),
            "reservedFor": [kube_objects.group_reference(group)],
        }
        kube_client.update_status(client.RESOURCE_CLAIMS, {**stored, "status": status})
        kube_client.delete(client.POD_GROUPS, "train", namespace=namespace)
        # A later write the controller sees after the deletion: the PodGroup's finalizer goes, and with it the group.
        kube_client.patch(client.POD_GROUPS, "train", namespace=namespace, patch={"metadata": {"finalizers": None}})

        def released() -> dict[str, Any] | None:
            claim = claims(kube_client, namespace).get(name)
            assert claim is not None, "the resourceclaim controller deleted the claim"
            return claim if not claim.get("status") and not claim["metadata"].get("finalizers") else None

        claim = controlplane.wait_until(released, what="the claim is released and unprotected")
        assert claim["metadata"].get("deletionTimestamp") is None
    finally:
        components.stop()
