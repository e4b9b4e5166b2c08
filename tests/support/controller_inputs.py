"""Builders of the model values the claim controller's pure functions take (shared by its unit tests)."""

from __future__ import annotations

from collections.abc import Mapping

from dractl import model
from dractl.controller import claims as controller
from dractl.model import podclaims

ALLOCATION = model.AllocationResult(
    results=(
        model.DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="node-a", device="gpu-0"),
    )
)


KCM_APPLY = {
    "manager": "ResourceClaimController",
    "operation": "Apply",
    "apiVersion": "v1",
    "time": "2026-11-27T04:26:50Z",
    "fieldsType": "FieldsV1",
    "fieldsV1": {"f:status": {"f:resourceClaimStatuses": {'k:{"name":"gpu"}': {".": {}, "f:name": {}}}}},
    "subresource": "status",
}
"""The managedFields entry kube-controller-manager 1.36.2's resourceclaim controller leaves on a pod whose claim it
recorded (read from a real one)."""


def pod(
    name: str = "trainer",
    *,
    uid: str = "",
    templates: Mapping[str, str] | None = None,
    direct: Mapping[str, str] | None = None,
    phase: str = "Running",
    node: str = "",
    recorded: Mapping[str, str | None] | None = None,
    deleting: bool = False,
    group: str = "",
) -> controller.PodState:
    """A pod with template entries (`templates`: pod claim -> template) and direct ones (pod claim -> claim),
    joining the `scheduling.k8s.io` PodGroup `group` when given."""
    entries = _entries(templates, direct)
    meta = _meta(name, uid=uid, resource_version="7", deleting=deleting)
    return controller.PodState(
        pod=model.Pod(
            meta=meta,
            resource_claims=entries,
            node_name=node,
            pod_group=model.PodGroupRef(name=group, api=model.PodGroupApi.WORKLOAD) if group else None,
        ),
        phase=phase,
        claim_statuses=dict(recorded or {}),
    )


def group(
    name: str = "train",
    *,
    uid: str = "",
    templates: Mapping[str, str] | None = None,
    direct: Mapping[str, str] | None = None,
    recorded: Mapping[str, str | None] | None = None,
    deleting: bool = False,
) -> controller.GroupState:
    """A v1alpha2 PodGroup with template entries (entry -> template) and direct ones (entry -> claim)."""
    entries = _entries(templates, direct)
    meta = _meta(name, uid=uid, resource_version="5", deleting=deleting)
    return controller.GroupState(
        group=model.PodGroup(meta=meta, api=model.PodGroupApi.WORKLOAD, resource_claims=entries),
        claim_statuses=dict(recorded or {}),
    )


def ref(owner: controller.PodState | controller.GroupState) -> model.ResourceClaimConsumerReference:
    if isinstance(owner, controller.GroupState):
        return model.ResourceClaimConsumerReference(
            resource="podgroups", name=owner.name, uid=owner.uid, api_group="scheduling.k8s.io"
        )
    return model.ResourceClaimConsumerReference(resource="pods", name=owner.name, uid=owner.uid)


def claim(
    name: str,
    *,
    owner: controller.PodState | controller.GroupState | None = None,
    pod_claim: str = "gpu",
    reserved: tuple[model.ResourceClaimConsumerReference, ...] = (),
    allocated: bool = False,
    finalizer: bool = False,
    deleting: bool = False,
) -> model.ResourceClaim:
    """A claim, generated for `owner`'s `pod_claim` when `owner` is given."""
    owners: tuple[Mapping[str, object], ...] = ()
    annotations: dict[str, str] = {}
    if isinstance(owner, controller.GroupState):
        kind = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup"}
        owners = ({**kind, "name": owner.name, "uid": owner.uid, "controller": True},)
        annotations[podclaims.POD_CLAIM_NAME_ANNOTATION] = pod_claim
    elif owner is not None:
        owners = (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            },
        )
        annotations[podclaims.POD_CLAIM_NAME_ANNOTATION] = pod_claim
    meta = model.ObjectMeta(
        name=name,
        namespace="ns",
        uid=f"uid-{name}",
        resource_version="3",
        annotations=annotations,
        owner_references=owners,
        finalizers=(controller.DELETE_PROTECTION_FINALIZER,) if finalizer else (),
        deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None,
    )
    return model.ResourceClaim(
        meta=meta, spec=model.ResourceClaimSpec(), allocation=ALLOCATION if allocated else None, reserved_for=reserved
    )


def by_name(*claims: model.ResourceClaim) -> dict[str, model.ResourceClaim]:
    return {item.meta.name: item for item in claims}


def _entries(
    templates: Mapping[str, str] | None, direct: Mapping[str, str] | None
) -> tuple[model.PodResourceClaim, ...]:
    """`resourceClaims` entries: from templates (entry -> template), then direct ones (entry -> claim). Pure."""
    return (
        *(
            model.PodResourceClaim(name=key, resource_claim_template_name=value)
            for key, value in (templates or {}).items()
        ),
        *(model.PodResourceClaim(name=key, resource_claim_name=value) for key, value in (direct or {}).items()),
    )


def _meta(name: str, *, uid: str, resource_version: str, deleting: bool) -> model.ObjectMeta:
    """Metadata in namespace `ns`, the uid `uid-<name>` unless given, being deleted when `deleting`. Pure."""
    return model.ObjectMeta(
        name=name,
        namespace="ns",
        uid=uid or f"uid-{name}",
        resource_version=resource_version,
        deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None,
    )
