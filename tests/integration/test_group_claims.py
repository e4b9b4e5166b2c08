"""dractl's claim controller with PodGroup claims (`scheduling.k8s.io/v1alpha2` `spec.resourceClaims`), against
the real kube-apiserver: the same claims, records, reservations and release as kube-controller-manager's
resourceclaim controller (`test_group_claims_upstream.py` records those), and no duplicate beside it.

The controller talks through the fault proxy, so its writes are counted; the tests play the scheduler.
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

SHARED = {"name": "shared", "resourceClaimTemplateName": "gpu-template"}
OWN = kube_objects.from_template("gpu-template", pod_claim="own")
FINALIZER = controller.DELETE_PROTECTION_FINALIZER


def _template(api: client.Client, namespace: str) -> None:
    api.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        kube_objects.template(
            "gpu-template", namespace=namespace, claim_metadata={"labels": {"team": "ml"}, "annotations": {"a": "b"}}
        ),
    )


def _group(api: client.Client, namespace: str, name: str = "train") -> dict[str, Any]:
    return api.create(client.POD_GROUPS, kube_objects.pod_group(name, namespace=namespace, claims=[SHARED]))


def _records(api: client.Client, resource: client.Resource, namespace: str, name: str) -> dict[str, str]:
    """The pod's or PodGroup's status.resourceClaimStatuses as {entry name: claim name}."""
    status = api.get(resource, name, namespace=namespace).get("status") or {}
    return {entry["name"]: entry.get("resourceClaimName", "") for entry in status.get("resourceClaimStatuses") or ()}


def _claims(api: client.Client, namespace: str) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in api.list(client.RESOURCE_CLAIMS, namespace=namespace).items}


def _owners(api: client.Client, namespace: str) -> list[tuple[str, str]]:
    """(owner kind/name, pod-claim-name annotation) of every claim, sorted: one entry per claim."""
    return sorted(
        (
            "/".join((ref["kind"], ref["name"])) if (ref := (c["metadata"].get("ownerReferences") or [{}])[0]) else "",
            c["metadata"].get("annotations", {}).get(podclaims.POD_CLAIM_NAME_ANNOTATION, ""),
        )
        for c in _claims(api, namespace).values()
    )


def _status(api: client.Client, namespace: str, name: str) -> dict[str, Any]:
    return api.get(client.RESOURCE_CLAIMS, name, namespace=namespace).get("status") or {}


def test_a_group_claim_is_made_once_recorded_in_the_group_and_its_members_and_a_second_sync_writes_nothing(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: as upstream, a member of a PodGroup that does not exist gets none of its claims; the group's
    template claim is made once (generateName `<group>-<entry>-`, the template's labels and annotations plus the
    pod-claim-name annotation, a controller owner reference to the PodGroup without blockOwnerDeletion) and recorded
    in the group's status; each member records it for its matching entry and gets its own claims for the others;
    syncing the converged group, pods and claims again writes nothing."""
    _template(kube_client, namespace)
    for name in ("m0", "m1"):
        kube_client.create(
            client.PODS, kube_objects.group_member(name, namespace=namespace, group="train", claims=[SHARED, OWN])
        )
    ctl = make_controller()
    ctl.sync_pod(namespace, "m0")
    assert fault_proxy.writes() == [] and _claims(kube_client, namespace) == {}

    group = _group(kube_client, namespace)
    shared = controlplane.wait_until(
        lambda: _records(kube_client, client.POD_GROUPS, namespace, "train").get("shared"),
        what="the group records its claim",
    )
    meta = _claims(kube_client, namespace)[shared]["metadata"]
    assert meta["generateName"] == "train-shared-"
    assert meta["annotations"] == {"a": "b", podclaims.POD_CLAIM_NAME_ANNOTATION: "shared"}
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
    for name in ("m0", "m1"):
        records = controlplane.wait_until(
            lambda name=name: (r := _records(kube_client, client.PODS, namespace, name)) and len(r) == 2 and r,
            what=f"{name} records both claims",
        )
        assert records["shared"] == shared and records["own"].startswith(f"{name}-own-")
    assert _owners(kube_client, namespace) == [("Pod/m0", "own"), ("Pod/m1", "own"), ("PodGroup/train", "shared")]

    def caught_up() -> bool:
        cached = ctl.pod_groups.store.get(f"{namespace}/train")
        pods = [ctl.pods.store.get(f"{namespace}/{name}") for name in ("m0", "m1")]
        return (
            cached is not None
            and cached.claim_statuses.get("shared") == shared
            and all(pod is not None and len(pod.claim_statuses) == 2 for pod in pods)
            and len(ctl.claims.store.values()) == 3
        )

    controlplane.wait_until(caught_up, what="the controller's caches caught up")
    fault_proxy.clear()
    ctl.sync_group(namespace, "train")
    for name in ("m0", "m1"):
        ctl.sync_pod(namespace, name)
    for name in _claims(kube_client, namespace):
        ctl.sync_claim(namespace, name)
    assert fault_proxy.writes() == []


def test_a_bound_members_group_claim_is_reserved_for_the_group_and_released_once_the_group_is_gone(
    kube_client: client.Client,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: as upstream, an allocated group claim used by a member bound to a node is reserved for the PodGroup
    (not the pod); while the group is being deleted (its protection finalizer held) the reservation stays; once it
    is gone (its member still bound: no kubelet ends it), the reservation is dropped, the claim deallocated and its
    delete-protection finalizer removed, and the claim itself is left to the garbage collector (no controller
    manager runs here, so it stays)."""
    _template(kube_client, namespace)
    group = _group(kube_client, namespace)
    ctl = make_controller()
    name = controlplane.wait_until(
        lambda: _records(kube_client, client.POD_GROUPS, namespace, "train").get("shared"),
        what="the group records its claim",
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
    controlplane.wait_until(
        lambda: _status(kube_client, namespace, name).get("reservedFor") == [kube_objects.group_reference(group)],
        what="the claim is reserved for the PodGroup",
    )
    kube_client.delete(client.POD_GROUPS, "train", namespace=namespace)
    deleting = kube_client.get(client.POD_GROUPS, "train", namespace=namespace)
    assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["finalizers"]

    def seen_deleting() -> bool:
        cached = ctl.pod_groups.store.get(f"{namespace}/train")
        return cached is not None and cached.deleting

    controlplane.wait_until(seen_deleting, what="the controller sees the group being deleted")
    ctl.sync_claim(namespace, name)
    assert _status(kube_client, namespace, name)["reservedFor"] == [kube_objects.group_reference(group)]
    kube_client.patch(client.POD_GROUPS, "train", namespace=namespace, patch={"metadata": {"finalizers": None}})

    def released() -> bool:
        claim = kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace)
        status = claim.get("status") or {}
        return (
            not status.get("allocation") and not status.get("reservedFor") and not claim["metadata"].get("finalizers")
        )

    controlplane.wait_until(released, what="the claim is released and unprotected")
    assert name in _claims(kube_client, namespace)


def test_beside_kube_controller_managers_claim_controller_a_group_gets_one_claim(
    upstream: controlplane.Components,
    kube_client: client.Client,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: beside kube-controller-manager's resourceclaim controller, PodGroups created while both run (each
    with a member) end with exactly one claim per group entry, the one the group records and its member records,
    whichever controller made it: each adopts what the other recorded, and a claim made in the same moment as the
    recorded one is deleted as a duplicate."""
    _template(kube_client, namespace)
    make_controller()
    groups = [f"g{i}" for i in range(4)]
    for name in groups:
        _group(kube_client, namespace, name)
        kube_client.create(
            client.PODS,
            kube_objects.group_member(f"{name}-m", namespace=namespace, group=name, claims=[SHARED]),
        )
    recorded = {}
    for name in groups:
        shared = recorded[name] = controlplane.wait_until(
            lambda name=name: _records(kube_client, client.POD_GROUPS, namespace, name).get("shared"),
            what=f"{name} records its claim",
        )
        controlplane.wait_until(
            lambda name=name, shared=shared: (
                _records(kube_client, client.PODS, namespace, f"{name}-m").get("shared") == shared
            ),
            what=f"{name}'s member records the group's claim",
        )

    def one_each() -> bool:
        return sorted(_claims(kube_client, namespace)) == sorted(recorded.values())

    controlplane.wait_until(one_each, what="every group has exactly its recorded claim")
    assert _owners(kube_client, namespace) == [(f"PodGroup/{name}", "shared") for name in groups]


def test_in_a_cluster_without_the_upstream_claim_controller_a_deleted_groups_claim_is_released_then_collected(
    upstream_without_claims: controlplane.Components,
    kube_client: client.Client,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: where kube-controller-manager runs without its resourceclaim controller (dractl's makes the claims),
    deleting a PodGroup whose claim is allocated and reserved for it ends with the claim gone: dractl releases it
    (reservation, allocation, delete-protection finalizer) and the garbage collector deletes it by its owner
    reference."""
    _template(kube_client, namespace)
    group = _group(kube_client, namespace)
    make_controller()
    name = controlplane.wait_until(
        lambda: _records(kube_client, client.POD_GROUPS, namespace, "train").get("shared"),
        what="the group records its claim",
    )
    stored = kube_client.get(client.RESOURCE_CLAIMS, name, namespace=namespace)
    stored["metadata"]["finalizers"] = [FINALIZER]
    stored = kube_client.update(client.RESOURCE_CLAIMS, stored)
    allocated = {"allocation": kube_objects.allocation("node-a", ["gpu-0"])}
    kube_client.update_status(
        client.RESOURCE_CLAIMS,
        {**stored, "status": {**allocated, "reservedFor": [kube_objects.group_reference(group)]}},
    )
    kube_client.delete(client.POD_GROUPS, "train", namespace=namespace)
    controlplane.wait_until(lambda: name not in _claims(kube_client, namespace), what="the group's claim is deleted")


def _group_claim(api: client.Client, namespace: str, name: str, group: dict[str, Any]) -> None:
    """Create claim `name` as a claim controller makes one for `group`'s entry `shared`."""
    owner = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "name": group["metadata"]["name"],
        "uid": group["metadata"]["uid"],
        "controller": True,
    }
    body = kube_objects.claim(name, namespace=namespace, annotations={podclaims.POD_CLAIM_NAME_ANNOTATION: "shared"})
    body["metadata"]["ownerReferences"] = [owner]
    api.create(client.RESOURCE_CLAIMS, body)


def test_a_groups_duplicate_is_deleted_and_a_deleted_claim_made_again(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    make_controller: Callable[[], controller.ClaimController],
) -> None:
    """Guards: of two claims made for one group entry (a race between two controllers), the one the group does not
    record is deleted and the recorded one kept, with nothing created; a group's recorded claim deleted while the
    group lives is made again and recorded."""
    _template(kube_client, namespace)
    group = _group(kube_client, namespace)
    _group_claim(kube_client, namespace, "train-shared-aaaaa", group)
    _group_claim(kube_client, namespace, "train-shared-bbbbb", group)
    kube_client.patch(
        client.POD_GROUPS,
        "train",
        namespace=namespace,
        subresource="status",
        patch={"status": {"resourceClaimStatuses": [{"name": "shared", "resourceClaimName": "train-shared-bbbbb"}]}},
    )
    make_controller()
    controlplane.wait_until(
        lambda: list(_claims(kube_client, namespace)) == ["train-shared-bbbbb"], what="the duplicate is deleted"
    )
    assert [r for r in fault_proxy.writes() if r.method == "POST" and "/resourceclaims" in r.target] == []

    kube_client.delete(client.RESOURCE_CLAIMS, "train-shared-bbbbb", namespace=namespace)
    again = controlplane.wait_until(
        lambda: (
            (name := _records(kube_client, client.POD_GROUPS, namespace, "train").get("shared")) != "train-shared-bbbbb"
            and name
        ),
        what="the group records a new claim",
    )
    assert list(_claims(kube_client, namespace)) == [again] and again.startswith("train-shared-")
