"""The claim lifecycle controller: kube-controller-manager's resourceclaim controller, in dractl.

What it does: watches Pods, ResourceClaims and ResourceClaimTemplates through informers and
feeds one rate-limited work queue with two kinds of key, `pod:<ns>/<name>` and
`claim:<ns>/<name>`. `sync_pod` creates the claims a pod's `resourceClaimTemplateName` entries
ask for (generateName `<pod>-<podClaim>-` with upstream's truncation, the template's labels and
annotations plus `resource.kubernetes.io/pod-claim-name`, a controller owner reference to the
pod, the template's spec verbatim), records them in `pod.status.resourceClaimStatuses`, and
reserves allocated claims for a pod already bound to a node. `sync_claim` removes `reservedFor`
entries of pods that are gone (confirmed by a live GET; another UID means gone) or finished,
deallocates the claim when the last entry goes and the claim carries the delete-protection
finalizer, removes that finalizer, and deletes generated claims nobody reserves once their pod
is done, gone, or records another claim for the same pod claim (a duplicate from a race with
kube-controller-manager).

PodGroup claims (`scheduling.k8s.io/v1alpha2` PodGroup `spec.resourceClaims`, where the server
serves PodGroups: asked once by `start()`), as kube-controller-manager 1.36 handles them
(`tests/integration/test_group_claims_upstream.py` records it): a third key kind,
`podgroup:<ns>/<name>`, whose `sync_group` makes one claim per template entry and group (named
and annotated as a pod's, owned by the PodGroup without blockOwnerDeletion) and records it in the
group's `status.resourceClaimStatuses`. A pod that joins a PodGroup gets nothing until the group
exists; its entries equal to the group's record the group's claim, never one of their own, and
when it is bound the group's allocated claims are reserved for the PodGroup (a `podgroups`
entry), not for the pod. `sync_claim` drops a `podgroups` entry once its group is gone or
replaced (not while it is being deleted) and deallocates as for pods; deleting a gone group's
claim is the garbage collector's (its owner reference), as upstream, but a duplicate of a group
claim is deleted here as a pod's is.

Deallocation rule (decided as upstream): only a claim with the finalizer
`resource.kubernetes.io/delete-protection` is ever deallocated. kube-scheduler adds it before
it writes an allocation, and dractl's scheduler does the same, so "has the finalizer" is
exactly "allocated by a scheduler that expects the claim controller to clean up". A claim that
something else allocated without it is never deallocated here.

How it writes: desired states come from pure functions (`plan_pod`, `status_entries`,
`reservations_to_add`, `plan_claim`); the sync methods only gather inputs and write the
difference. Every write of an existing object carries the resourceVersion it was computed from
(a merge patch of the status subresource, or for the finalizer `kube.finalizers`, which leaves
the claim's spec byte for byte as stored), so a concurrent change fails with 409, the key is
requeued with backoff, and the next sync decides again from fresh state. Creates are preceded
by a search for an existing claim (the informer's cache, plus the claims this process made that
the cache has not shown yet), so a restart between "claim created" and "status written" (the
first list has the claim) or a retry after a failed status write leads to adoption, not a
second claim. A claim kube-controller-manager makes at the same moment as dractl's is a
duplicate, which the claim sync deletes, as upstream, once a live read of the pod confirms that
it records the other claim (the pod cache may lag behind a status kube-controller-manager has
just written). A second sync over unchanged state writes nothing.

Beside another claim controller: kube-controller-manager runs its own resourceclaim controller
unless started with `--controllers=*,-resource-claim-controller`. Two controllers recording claims
for one pod can leave it bound to a claim that is not the one allocated (one records its claim
after the other's was scheduled), so this controller only runs where that one is off. It watches
for the proof that it is not: a pod (or PodGroup) whose `status.resourceClaimStatuses` another field manager
wrote while this controller runs (kube-controller-manager's is `ResourceClaimController`; what
the first list shows is history, e.g. from before the switch, and does not count). It then stops
writing for good, with one warning log line and `dractl_claim_controller_deferring` at 1.

What it must not do: import `dractl.node`, talk to the API except through `dractl.kube`, write
anything once another claim controller was seen, write fields it does not own, deallocate
claims without the finalizer, delete a claim that is reserved or not controlled by a pod (or, as
a duplicate, by a PodGroup), or take a PodGroup as gone where PodGroups are not served.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import prometheus_client

from dractl import daemon, model
from dractl.controller import loop
from dractl.kube import client as kube_client
from dractl.kube import events, finalizers, informer, workqueue
from dractl.model import decode as model_decode
from dractl.model import limits, podclaims

log = logging.getLogger(__name__)

POD_PREFIX = "pod:"
CLAIM_PREFIX = "claim:"
GROUP_PREFIX = "podgroup:"
DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
FAILED_CREATION = "FailedResourceClaimCreation"
"""Warning Event reason on a pod whose claim could not be created (upstream's reason)."""
RESERVATION_FAILED = "FailedResourceClaimReservation"
"""Warning Event reason on a bound pod that cannot be added to its claim's `reservedFor`."""
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


class RetryLater(Exception):
    """A sync could not finish for a reason that may go away (a missing template, a full claim); retry with backoff."""


class Deferred(Exception):
    """Another claim controller was seen at work: this one writes nothing more (raised before a write, ends the
    sync quietly)."""


class InvalidInput(Exception):
    """User input the controller cannot use (a template the model refuses). Reported by a Warning Event and not
    retried: fixing the object is an informer event that syncs the pod again."""


# --- Values --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PodState:
    """A pod as the controller sees it: the model's pod plus the status fields the controller reads.

    `claim_statuses` maps a pod claim name to the recorded claim name, or to None when the
    pod recorded that no claim is needed; a pod claim absent from it has no claim yet.
    `claim_status_writers` holds (manager, time) of each `metadata.managedFields` entry that
    owns part of `status.resourceClaimStatuses`: who recorded the claims, and when.
    """

    pod: model.Pod
    phase: str = ""
    claim_statuses: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    claim_status_writers: frozenset[tuple[str, str]] = frozenset()

    @property
    def namespace(self) -> str:
        return self.pod.meta.namespace

    @property
    def name(self) -> str:
        return self.pod.meta.name

    @property
    def uid(self) -> str:
        return self.pod.meta.uid

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def deleting(self) -> bool:
        return self.pod.meta.deletion_timestamp is not None

    @property
    def done(self) -> bool:
        """No longer needs its claims: finished, or deleted before it was scheduled (as upstream's podutil)."""
        return self.phase in _DONE_PHASES or (self.deleting and not self.pod.node_name)

    @property
    def group_name(self) -> str:
        """The `scheduling.k8s.io` PodGroup the pod joins (`spec.schedulingGroup.podGroupName`), or ""."""
        ref = self.pod.pod_group
        return ref.name if ref is not None and ref.api is model.PodGroupApi.WORKLOAD else ""


def decode_pod(raw: Mapping[str, Any]) -> PodState | None:
    """One raw pod as a `PodState`, or None (logged by the kube layer) when the model refuses it. Pure.

    The model's Pod carries what allocation needs; the two status fields this controller
    also reads (`phase`, `resourceClaimStatuses`) and who wrote the second (`managedFields`) are
    taken from the raw object here, leniently: entries without a name are ignored.
    """
    pod = kube_client.decode(raw)
    if not isinstance(pod, model.Pod):
        return None
    status = raw.get("status") or {}
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return PodState(
        pod=pod,
        phase=phase if isinstance(phase, str) else "",
        claim_statuses=_recorded(raw),
        claim_status_writers=_claim_status_writers(raw),
    )


def _claim_status_writers(raw: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """(manager, time) of the managedFields entries owning part of `status.resourceClaimStatuses`. Pure."""
    meta = raw.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, Mapping) else None
    writers: set[tuple[str, str]] = set()
    for entry in entries if isinstance(entries, list) else ():
        fields = entry.get("fieldsV1") if isinstance(entry, Mapping) else None
        status = fields.get("f:status") if isinstance(fields, Mapping) else None
        if isinstance(status, Mapping) and "f:resourceClaimStatuses" in status:
            writers.add((str(entry.get("manager") or ""), str(entry.get("time") or "")))
    return frozenset(writers)


@dataclasses.dataclass(frozen=True, slots=True)
class GroupState:
    """A `scheduling.k8s.io/v1alpha2` PodGroup as the controller sees it: the model's group plus its
    `status.resourceClaimStatuses` (entry name -> claim name) and who wrote them (as `PodState`'s)."""

    group: model.PodGroup
    claim_statuses: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    claim_status_writers: frozenset[tuple[str, str]] = frozenset()

    @property
    def namespace(self) -> str:
        return self.group.meta.namespace

    @property
    def name(self) -> str:
        return self.group.meta.name

    @property
    def uid(self) -> str:
        return self.group.meta.uid

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def deleting(self) -> bool:
        return self.group.meta.deletion_timestamp is not None


def decode_group(raw: Mapping[str, Any]) -> GroupState | None:
    """One raw v1alpha2 PodGroup as a `GroupState`, or None (logged) when the model refuses it. Pure but for the
    log line."""
    meta = raw.get("metadata") or {}
    try:
        groups = model_decode.load_documents([dict(raw)], file="api").pod_groups
    except model_decode.DecodeError as error:
        log.warning("skipping PodGroup %s/%s: it does not decode: %s", meta.get("namespace"), meta.get("name"), error)
        return None
    if len(groups) != 1 or groups[0].api is not model.PodGroupApi.WORKLOAD:
        return None
    return GroupState(group=groups[0], claim_statuses=_recorded(raw), claim_status_writers=_claim_status_writers(raw))


def _recorded(raw: Mapping[str, Any]) -> dict[str, str | None]:
    """`status.resourceClaimStatuses` of a pod or PodGroup as {entry name: claim name or None}, leniently: entries
    without a name are ignored. Pure."""
    status = raw.get("status") or {}
    recorded: dict[str, str | None] = {}
    entries = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            claim_name = entry.get("resourceClaimName")
            recorded[entry["name"]] = claim_name if isinstance(claim_name, str) and claim_name else None
    return recorded


def other_claim_writer(old: PodState | GroupState | None, new: PodState | GroupState, *, ours: str) -> str | None:
    """The field manager, other than `ours`, that wrote `new`'s `status.resourceClaimStatuses` since `old` (None:
    a pod or PodGroup not seen before), or None. Pure.

    Another manager's entry that is new or has a newer time is a write by another claim
    controller (kube-controller-manager's resourceclaim controller applies it as
    `ResourceClaimController`). An entry that shrank or vanished is not: dractl's own write takes
    the fields over.
    """
    seen = old.claim_status_writers if old is not None else frozenset()
    others = sorted(manager for manager, _ in new.claim_status_writers - seen if manager != ours)
    return others[0] if others else None


def _decode_claim(raw: Mapping[str, Any]) -> model.ResourceClaim | None:
    value = kube_client.decode(raw)
    return value if isinstance(value, model.ResourceClaim) else None


def _decode_template(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The raw template when the model accepts it (the spec is copied verbatim from the raw object), else None."""
    return raw if isinstance(kube_client.decode(raw), model.ResourceClaimTemplate) else None


# --- Pure: what a pod needs --------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Create:
    """A claim to create for `pod_claim_name` from the template `template_name`."""

    pod_claim_name: str
    template_name: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodPlan:
    """What a pod's template claims need: existing claims to record and claims to create.

    `adopt` maps a pod claim name to the existing claim to record for it.
    """

    adopt: Mapping[str, str]
    create: tuple[Create, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerKind:
    """The kind of object a generated claim is made for: its API group ("" for core) and kind."""

    api_group: str
    kind: str


POD = OwnerKind("", "Pod")
POD_GROUP = OwnerKind(kube_client.POD_GROUPS.group, "PodGroup")


def controller_of(claim: model.ResourceClaim, kind: OwnerKind = POD) -> Mapping[str, Any] | None:
    """The claim's controlling owner reference if it is of `kind` (any version of its API group), else None. Pure."""
    for ref in claim.meta.owner_references:
        if ref.get("controller") is True:
            api_group = str(ref.get("apiVersion") or "").rpartition("/")[0]
            if api_group == kind.api_group and ref.get("kind") == kind.kind:
                return ref
            return None
    return None


def controlled_by(claim: model.ResourceClaim, pod_uid: str, kind: OwnerKind = POD) -> bool:
    """Whether `claim` is controlled by the object of `kind` (a pod unless told) with UID `pod_uid`. Pure."""
    ref = controller_of(claim, kind)
    return ref is not None and bool(pod_uid) and ref.get("uid") == pod_uid


def find_generated(
    claims: Iterable[model.ResourceClaim], *, pod_uid: str, pod_claim_name: str, kind: OwnerKind = POD
) -> str | None:
    """The name of a claim made for this pod claim (controlled by the pod, or the PodGroup of `kind`, with UID
    `pod_uid`, annotated with the entry's name).

    When there are several (two controllers raced), the first by name, so every caller picks
    the same one. Claims being deleted do not count. Pure.
    """
    names = sorted(
        claim.meta.name
        for claim in claims
        if claim.meta.deletion_timestamp is None
        and controlled_by(claim, pod_uid, kind)
        and claim.meta.annotations.get(podclaims.POD_CLAIM_NAME_ANNOTATION) == pod_claim_name
    )
    return names[0] if names else None


def _plan_entries(
    entries: Iterable[model.PodResourceClaim],
    *,
    recorded: Mapping[str, str | None],
    owner_uid: str,
    kind: OwnerKind,
    claims: Mapping[str, model.ResourceClaim],
) -> PodPlan:
    """What the `resourceClaimTemplateName` entries of one pod or PodGroup need. Pure.

    Per entry, as upstream: one recorded as not needed is skipped; one recorded with a claim
    that exists and is controlled by the owner is done; otherwise a claim already made for it
    (controlled by the owner, with the pod-claim-name annotation) is adopted; otherwise one is
    to be created.
    """
    adopt: dict[str, str] = {}
    create: list[Create] = []
    for entry in entries:
        if entry.resource_claim_template_name is None:
            continue
        if entry.name in recorded:
            name = recorded[entry.name]
            if name is None:
                continue
            claim = claims.get(name)
            if claim is not None and controlled_by(claim, owner_uid, kind):
                continue  # Even while it is being deleted (as upstream): a new one is made once it is gone.
        found = find_generated(claims.values(), pod_uid=owner_uid, pod_claim_name=entry.name, kind=kind)
        if found is not None:
            adopt[entry.name] = found
        else:
            create.append(Create(pod_claim_name=entry.name, template_name=entry.resource_claim_template_name))
    return PodPlan(adopt=adopt, create=tuple(create))


def group_entries(pod: PodState, group: GroupState | None) -> frozenset[str]:
    """The names of the pod's claim entries that stand for its PodGroup's claims: those equal in every field to an
    entry of the group's `spec.resourceClaims` (the API's matching rule). Pure."""
    if group is None or group.name != pod.group_name or group.namespace != pod.namespace:
        return frozenset()
    return frozenset(entry.name for entry in pod.pod.resource_claims if entry in group.group.resource_claims)


def group_claim_names(pod: PodState, group: GroupState | None) -> list[str]:
    """The names of the group's claims the pod uses that are known now: named ones, and generated ones the
    PodGroup's status records. Pure."""
    shared = group_entries(pod, group)
    names: list[str] = []
    for entry in pod.pod.resource_claims:
        if entry.name in shared and group is not None:
            name = entry.resource_claim_name or group.claim_statuses.get(entry.name)
            if name and name not in names:
                names.append(name)
    return names


def plan_pod(pod: PodState, claims: Mapping[str, model.ResourceClaim], *, group: GroupState | None = None) -> PodPlan:
    """What `pod`'s `resourceClaimTemplateName` entries need, given the claims of its namespace by name and the
    `scheduling.k8s.io` PodGroup it joins (None: it joins none, or the group does not exist). Pure.

    Per entry as `_plan_entries` says. Finished or deleted pods need nothing. As upstream, a pod
    that joins a PodGroup gets nothing until the group exists; then an entry equal to one of the
    group's records the group's claim (from the group's status; nothing while the group has none
    yet) and is never made for the pod.
    """
    if pod.done or pod.deleting or (pod.group_name and group is None):
        return PodPlan(adopt={}, create=())
    shared = group_entries(pod, group)
    plan = _plan_entries(
        (entry for entry in pod.pod.resource_claims if entry.name not in shared),
        recorded=pod.claim_statuses,
        owner_uid=pod.uid,
        kind=POD,
        claims=claims,
    )
    adopt = dict(plan.adopt)
    for name in sorted(shared):
        made = group.claim_statuses.get(name) if group is not None else None
        if made and pod.claim_statuses.get(name) != made:
            adopt[name] = made
    return PodPlan(adopt=adopt, create=plan.create)


def plan_group(group: GroupState, claims: Mapping[str, model.ResourceClaim]) -> PodPlan:
    """What a PodGroup's `resourceClaimTemplateName` entries need (one claim per group, as upstream makes it when
    the group exists, pods or not), given the claims of its namespace by name. A group being deleted needs
    nothing. Pure."""
    if group.deleting:
        return PodPlan(adopt={}, create=())
    return _plan_entries(
        group.group.resource_claims,
        recorded=group.claim_statuses,
        owner_uid=group.uid,
        kind=POD_GROUP,
        claims=claims,
    )


def status_entries(pod: PodState, recorded: Mapping[str, str]) -> list[dict[str, str]] | None:
    """The full `status.resourceClaimStatuses` once `recorded` (pod claim -> claim name) is in, or None if unchanged.

    Entries are kept in the pod's order; entries of other pod claims (written by whoever made
    them) are kept as they are. Pure.
    """
    return merged_statuses(pod.claim_statuses, [entry.name for entry in pod.pod.resource_claims], recorded)


def merged_statuses(
    statuses: Mapping[str, str | None], order: list[str], recorded: Mapping[str, str]
) -> list[dict[str, str]] | None:
    """The full `status.resourceClaimStatuses` of a pod or PodGroup once `recorded` is in, in the `order` of its
    spec's entries, or None if unchanged. Pure."""
    merged: dict[str, str | None] = dict(statuses)
    changed = False
    for pod_claim_name, claim_name in recorded.items():
        if merged.get(pod_claim_name) != claim_name:
            merged[pod_claim_name] = claim_name
            changed = True
    if not changed:
        return None
    names = sorted(merged, key=lambda name: (order.index(name) if name in order else len(order), name))
    entries: list[dict[str, str]] = []
    for name in names:
        value = merged[name]
        entries.append({"name": name, "resourceClaimName": value} if value else {"name": name})
    return entries


def claim_body(pod: PodState, *, pod_claim_name: str, template: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceClaim to create for `pod_claim_name` of `pod` from the raw `template`, as upstream makes it. Pure.

    generateName `<pod>-<podClaim>-` (truncated as upstream), the template's labels and
    annotations plus the pod-claim-name annotation, a controller owner reference to the pod
    (with blockOwnerDeletion), and the template's spec copied verbatim (deep-copied: the template
    is shared with the informer's store).
    """
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
    return _generated_claim(
        pod.namespace,
        owner={**owner, "controller": True, "blockOwnerDeletion": True},
        pod_claim_name=pod_claim_name,
        template=template,
    )


def group_claim_body(group: GroupState, *, pod_claim_name: str, template: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceClaim to create for the PodGroup's entry `pod_claim_name` from the raw `template`, as upstream
    makes it: as a pod's (`claim_body`, with the group's name) but owned by the PodGroup, a controller reference
    without blockOwnerDeletion. Pure."""
    owner = {"apiVersion": kube_client.POD_GROUPS.api_version, "kind": "PodGroup", "name": group.name}
    return _generated_claim(
        group.namespace,
        owner={**owner, "uid": group.uid, "controller": True},
        pod_claim_name=pod_claim_name,
        template=template,
    )


def _generated_claim(
    namespace: str, *, owner: Mapping[str, Any], pod_claim_name: str, template: Mapping[str, Any]
) -> dict[str, Any]:
    template_spec = template.get("spec") or {}
    template_meta = template_spec.get("metadata") or {}
    return {
        "apiVersion": kube_client.RESOURCE_CLAIMS.api_version,
        "kind": kube_client.RESOURCE_CLAIMS.kind,
        "metadata": {
            "generateName": podclaims.generate_name(str(owner["name"]), pod_claim_name),
            "namespace": namespace,
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": {
                **(template_meta.get("annotations") or {}),
                podclaims.POD_CLAIM_NAME_ANNOTATION: pod_claim_name,
            },
            "ownerReferences": [dict(owner)],
        },
        "spec": copy.deepcopy(template_spec.get("spec") or {}),
    }


def claim_names(pod: PodState) -> list[str]:
    """The names of the claims `pod` uses that are known now (direct names and recorded generated ones). Pure."""
    names: list[str] = []
    for entry in pod.pod.resource_claims:
        name = entry.resource_claim_name or pod.claim_statuses.get(entry.name)
        if name and name not in names:
            names.append(name)
    return names


def reservations_to_add(
    pod: PodState, claims: Mapping[str, model.ResourceClaim], *, group: GroupState | None = None
) -> list[str]:
    """Names of allocated claims that a pod already bound to a node uses but that do not list it in `reservedFor`.

    Only for bound pods that still run (the scheduler reserves for pods it binds; a pod bound
    by someone else would otherwise never start). Unallocated claims and claims being
    deleted are left alone. The claims of the pod's PodGroup (`group`) are reserved for the
    group instead (`group_reservations_to_add`), and a pod whose group does not exist gets
    nothing (as upstream). Pure.
    """
    if not pod.pod.node_name or pod.done or pod.deleting or (pod.group_name and group is None):
        return []
    shared = group_claim_names(pod, group)
    return [name for name in claim_names(pod) if name not in shared and _unreserved(claims.get(name), pod.uid)]


def group_reservations_to_add(
    pod: PodState, group: GroupState | None, claims: Mapping[str, model.ResourceClaim]
) -> list[str]:
    """Names of allocated claims of the pod's PodGroup that a member bound to a node uses but that do not list the
    group in `reservedFor` (upstream reserves a group's claim for the group, not for each pod). Pure."""
    if group is None or not pod.pod.node_name or pod.done or pod.deleting:
        return []
    return [name for name in group_claim_names(pod, group) if _unreserved(claims.get(name), group.uid)]


def _unreserved(claim: model.ResourceClaim | None, uid: str) -> bool:
    """Whether `claim` is allocated, not being deleted, and not reserved for the consumer with `uid`."""
    if claim is None or claim.allocation is None or claim.meta.deletion_timestamp is not None:
        return False
    return not any(ref.uid == uid for ref in claim.reserved_for)


def group_consumer(group: GroupState) -> dict[str, str]:
    """The `reservedFor` entry naming a PodGroup, as upstream writes it. Pure."""
    return {"apiGroup": POD_GROUP.api_group, "resource": "podgroups", "name": group.name, "uid": group.uid}


def consumer_entry(ref: model.ResourceClaimConsumerReference) -> dict[str, str]:
    """A `reservedFor` entry in the API's shape. Pure."""
    entry = {"resource": ref.resource, "name": ref.name, "uid": ref.uid}
    if ref.api_group:
        entry["apiGroup"] = ref.api_group
    return entry


# --- Pure: what a claim needs ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The writes a claim needs, in order: status (`reserved_for` not None or `deallocate`), finalizer, delete."""

    reserved_for: tuple[model.ResourceClaimConsumerReference, ...] | None = None
    deallocate: bool = False
    remove_finalizer: bool = False
    delete: bool = False

    @property
    def status_write(self) -> bool:
        return self.reserved_for is not None or self.deallocate

    @property
    def empty(self) -> bool:
        return not (self.status_write or self.remove_finalizer or self.delete)


def _pod_gone_or_done(pod: PodState | None, uid: str) -> bool:
    return pod is None or pod.uid != uid or pod.done


def plan_claim(
    claim: model.ResourceClaim,
    pods: Mapping[str, PodState | None],
    *,
    groups: Mapping[str, GroupState | None] | None = None,
    existing: Mapping[str, model.ResourceClaim] | None = None,
    finalizer_pending: bool = False,
) -> ClaimPlan:
    """The cleanup `claim` needs. Pure.

    `pods` maps each pod name the claim refers to (its `reservedFor` pods and its controlling
    pod) to the pod as it is now, or None when it is confirmed gone; a name missing from it is
    treated as unknown and kept. `groups` does the same for the PodGroups of its `podgroups`
    entries and its controlling PodGroup (None: the server does not serve PodGroups, so they are
    all unknown). `existing` holds, by name, at least the claims the controlling pod or PodGroup
    records (to recognise a duplicate: its owner records another existing claim that it controls).
    `finalizer_pending` says an earlier sync deallocated this claim but its finalizer removal
    failed, so the removal is retried even though no entry is dropped now.

    Rules (upstream's syncClaim): a pod entry is dropped when its pod is gone, replaced (another
    UID) or done; a PodGroup entry when its group is gone or replaced (not while it is being
    deleted: upstream keeps it until the group is gone); entries of other resources are kept.
    When entries were dropped and none
    remain, a claim with the delete-protection finalizer is deallocated in the same status
    write, and the finalizer is then removed once nothing is allocated. A claim being deleted
    that nothing reserves has its allocation cleared and finalizer removed. A claim nothing
    reserves that is controlled by a pod is deleted when that pod is done, gone or replaced,
    or when the pod records another existing claim for the same pod claim. A claim controlled by
    a PodGroup is deleted only as such a duplicate: once its group is gone, the garbage collector
    deletes it (upstream's split).
    """
    known = groups or {}
    keep = tuple(
        ref for ref in claim.reserved_for if not _pod_entry_ends(ref, pods) and not _group_entry_ends(ref, known)
    )
    dropped = len(keep) != len(claim.reserved_for)
    protected = DELETE_PROTECTION_FINALIZER in claim.meta.finalizers
    deleting = claim.meta.deletion_timestamp is not None
    deallocate = bool(protected and not keep and claim.allocation is not None and (dropped or deleting))
    allocated_after = claim.allocation is not None and not deallocate
    remove_finalizer = (
        protected and not keep and not allocated_after and (dropped or deleting or deallocate or finalizer_pending)
    )
    delete = False
    owner = controller_of(claim)
    group_owner = controller_of(claim, POD_GROUP)
    if not keep and group_owner is not None and not deleting and str(group_owner.get("name")) in known:
        group = known[str(group_owner.get("name"))]
        if group is not None and group.uid == group_owner.get("uid"):
            recorded = group.claim_statuses.get(claim.meta.annotations.get(podclaims.POD_CLAIM_NAME_ANNOTATION, ""))
            delete = _duplicate(
                claim, recorded, (existing or {}).get(recorded or ""), owner_uid=group.uid, kind=POD_GROUP
            )
    if not keep and owner is not None and not deleting:
        owner_name, owner_uid = str(owner.get("name") or ""), str(owner.get("uid") or "")
        if owner_name in pods:
            pod = pods[owner_name]
            if _pod_gone_or_done(pod, owner_uid):
                delete = True
            elif pod is not None:
                pod_claim_name = claim.meta.annotations.get(podclaims.POD_CLAIM_NAME_ANNOTATION)
                recorded = pod.claim_statuses.get(pod_claim_name) if pod_claim_name else None
                other = (existing or {}).get(recorded or "")
                delete = _duplicate(claim, recorded, other, owner_uid=owner_uid, kind=POD)
    return ClaimPlan(
        reserved_for=keep if dropped else None, deallocate=deallocate, remove_finalizer=remove_finalizer, delete=delete
    )


def _pod_entry_ends(ref: model.ResourceClaimConsumerReference, pods: Mapping[str, PodState | None]) -> bool:
    """Whether `ref` names a pod known to be gone, replaced or done."""
    is_pod = ref.resource == "pods" and not ref.api_group
    return is_pod and ref.name in pods and _pod_gone_or_done(pods[ref.name], ref.uid)


def _group_entry_ends(ref: model.ResourceClaimConsumerReference, groups: Mapping[str, GroupState | None]) -> bool:
    """Whether `ref` names a PodGroup known to be gone or replaced."""
    if ref.resource != "podgroups" or ref.api_group != POD_GROUP.api_group or ref.name not in groups:
        return False
    group = groups[ref.name]
    return group is None or group.uid != ref.uid


def _duplicate(
    claim: model.ResourceClaim,
    recorded: str | None,
    other: model.ResourceClaim | None,
    *,
    owner_uid: str,
    kind: OwnerKind,
) -> bool:
    """Whether `claim` is a duplicate: its owner records `recorded`, another existing claim it controls."""
    return bool(
        recorded
        and recorded != claim.meta.name
        and other is not None
        and controlled_by(other, owner_uid, kind)
        and other.meta.deletion_timestamp is None
    )


# --- The controller ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Metrics:
    creates: prometheus_client.Counter
    deallocations: prometheus_client.Counter
    errors: prometheus_client.Counter
    depth: prometheus_client.Gauge
    deferring: prometheus_client.Gauge


def _metrics_for(registry: prometheus_client.CollectorRegistry) -> _Metrics:
    return daemon.metrics_once(registry, "claims", lambda: _build_metrics(registry))


def _build_metrics(registry: prometheus_client.CollectorRegistry) -> _Metrics:
    return _Metrics(
        creates=prometheus_client.Counter(
            "dractl_claim_controller_creates",
            "ResourceClaims created from templates, by outcome.",
            ["status"],
            registry=registry,
        ),
        deallocations=prometheus_client.Counter(
            "dractl_claim_controller_deallocations",
            "ResourceClaims deallocated because nothing reserves them any more.",
            registry=registry,
        ),
        errors=prometheus_client.Counter(
            "dractl_claim_controller_sync_errors",
            "Syncs that failed and were requeued, by key kind.",
            ["kind"],
            registry=registry,
        ),
        depth=prometheus_client.Gauge(
            "dractl_claim_controller_queue_depth",
            "Keys waiting in the claim controller's work queue.",
            registry=registry,
        ),
        deferring=prometheus_client.Gauge(
            "dractl_claim_controller_deferring",
            "1 once another claim controller (kube-controller-manager's resourceclaim controller) was seen recording "
            "claims in pods' status.resourceClaimStatuses: this controller then writes nothing.",
            registry=registry,
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    """What claims are made for in one sync: a pod or a PodGroup. `where` names it in messages ("pod ns/name"),
    `ref` is where its Warning Events go, and `body` builds the claim for an entry from a raw template."""

    namespace: str
    uid: str
    ref: events.ObjectRef
    where: str
    body: Callable[[str, Mapping[str, Any]], dict[str, Any]]


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


class ClaimController:
    """The claim lifecycle controller. `start()` runs it in daemon threads; `stop()` ends them (once:
    a stopped controller is not started again; make a new one, e.g. on each leadership gain).

    Constructor:
    - `client`: the API client (every request the controller makes goes through it).
    - `registry`: the prometheus registry for its metrics (a private one when None):
      `dractl_claim_controller_creates_total{status}`, `dractl_claim_controller_deallocations_total`,
      `dractl_claim_controller_sync_errors_total{kind}`, `dractl_claim_controller_queue_depth`,
      `dractl_claim_controller_deferring`.
    - `recorder`: where Warning Events go (a `events.Recorder` on `client` when None).
    - `namespace`: watch one namespace only ("" = all).
    - `workers`: worker threads (keys are never processed by two at once).
    - `queue`: the work queue (a fresh one when None; tests inject one with their own backoff).
    - `sync_timeout`: seconds `start()` waits for the informers' first lists.

    `sync(key)`, `sync_pod(namespace, name)` and `sync_claim(namespace, name)` may also be
    called directly (tests do); they are idempotent and safe to call from any thread, though
    one key should be synced by one thread at a time (the work queue guarantees that).
    """

    def __init__(
        self,
        client: kube_client.Client,
        *,
        registry: prometheus_client.CollectorRegistry | None = None,
        recorder: events.Recorder | None = None,
        namespace: str = "",
        workers: int = 2,
        queue: workqueue.WorkQueue | None = None,
        sync_timeout: float = 60.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.sync_timeout = sync_timeout
        self.recorder = recorder or events.Recorder(client)
        self.queue = queue if queue is not None else workqueue.WorkQueue()
        self.registry = prometheus_client.CollectorRegistry() if registry is None else registry
        self.metrics = _metrics_for(self.registry)
        self.metrics.depth.set_function(lambda: float(len(self.queue)))
        self.metrics.deferring.set(0)
        self.pods: informer.Informer[PodState] = informer.Informer(
            client,
            kube_client.PODS,
            decode=decode_pod,
            namespace=namespace,
            handlers=informer.Handlers(
                on_add=lambda new: self._pod_changed(None, new),
                on_update=self._pod_changed,
                on_delete=self._pod_deleted,
            ),
        )
        self.claims: informer.Informer[model.ResourceClaim] = informer.Informer(
            client,
            kube_client.RESOURCE_CLAIMS,
            decode=_decode_claim,
            namespace=namespace,
            handlers=informer.Handlers(
                on_add=lambda new: self._claim_changed(None, new),
                on_update=self._claim_changed,
                on_delete=self._claim_deleted,
            ),
        )
        self.pod_groups: informer.Informer[GroupState] = informer.Informer(
            client,
            kube_client.POD_GROUPS,
            decode=decode_group,
            namespace=namespace,
            handlers=informer.Handlers(
                on_add=lambda new: self._group_changed(None, new),
                on_update=self._group_changed,
                on_delete=self._group_deleted,
            ),
        )
        # Whether the server serves `scheduling.k8s.io/v1alpha2` PodGroups: discovered by `start()`, which runs the
        # PodGroup informer only then. Until it is known (and where it is not served), PodGroups are unknown, never
        # taken as gone.
        self.pod_groups_served = False
        self.templates: informer.Informer[dict[str, Any]] = informer.Informer(
            client,
            kube_client.RESOURCE_CLAIM_TEMPLATES,
            decode=_decode_template,
            namespace=namespace,
            handlers=informer.Handlers(
                on_add=self._template_changed, on_update=lambda _, new: self._template_changed(new)
            ),
        )
        # Claims deallocated by this controller whose finalizer removal has not succeeded yet (by UID).
        self._finalizer_pending: set[str] = set()
        self._lock = threading.Lock()
        # Claim keys by the UID of their controlling pod, kept by the claim handlers, so a pod event
        # reaches the claims made for it (recorded or not) without a scan.
        self._owned: dict[str, set[str]] = {}
        # Claims this controller created, by (pod UID, pod claim), until the informer shows them.
        self._made: dict[tuple[str, str], str] = {}
        # The field manager of another claim controller seen recording claims in pods' status: from then on this
        # controller writes nothing (two controllers recording claims for one pod leave it bound to the wrong one).
        self._deferring_to: str | None = None
        self.workers = workers
        self._loop: loop.Loop | None = None

    # --- Running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the informers, wait for their first lists (up to `sync_timeout`), then the workers.

        Raises TimeoutError when the informers do not sync in time (the informers are stopped again).
        Whether the server serves PodGroups is asked first (one list): their informer runs only then.
        """
        self.pod_groups_served = self._serves_pod_groups()
        groups = (self.pod_groups,) if self.pod_groups_served else ()
        self._loop = loop.Loop(
            name="the claim controller",
            thread_name="claim-controller",
            queue=self.queue,
            informers=(self.templates, *groups, self.claims, self.pods),
            sync=self.sync,
            failed=self._failed,
            workers=self.workers,
        )
        self._loop.start_informers(self.sync_timeout)
        self._loop.start_workers()

    def _serves_pod_groups(self) -> bool:
        """Whether the server serves `scheduling.k8s.io/v1alpha2` PodGroups (alpha in Kubernetes 1.36: only where its
        runtime config turns the API on): listing them answers 404 where it does not. Other errors raise."""
        try:
            self.client.list(kube_client.POD_GROUPS, namespace=self.namespace, field_selector="metadata.name=-")
        except kube_client.NotFound:
            log.info("claim controller: the server does not serve PodGroups (scheduling.k8s.io/v1alpha2)")
            return False
        return True

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._loop is not None and self._loop.wait_synced(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking keys, let the workers finish the key in hand, stop the informers. Idempotent."""
        if self._loop is not None:
            self._loop.stop(timeout)

    def _failed(self, key: str, error: Exception) -> None:
        """Count and log a sync that raised; the loop retries the key with backoff."""
        self.metrics.errors.labels(kind=key.partition(":")[0]).inc()
        if isinstance(error, (kube_client.ApiError, RetryLater)):
            log.info("%s: %s; retrying with backoff", key, error)
        else:
            log.exception("%s: the sync failed; retrying with backoff", key)

    # --- Event handlers: they only enqueue keys ---------------------------------------------

    def _pod_changed(self, old: PodState | None, pod: PodState) -> None:
        if not pod.pod.resource_claims:
            return
        if old is not None or self.pods.has_synced():  # The first list is history, not activity.
            other = other_claim_writer(old, pod, ours=self.client.field_manager)
            if other is not None:
                self._defer(other, f"pod {pod.key}")
        self.queue.add(POD_PREFIX + pod.key)
        # Its claims too: a finished pod releases them, and a new record may leave a duplicate behind.
        self._enqueue_claims_of(pod)

    def _pod_deleted(self, pod: PodState) -> None:
        with self._lock:
            for made in [made for made in self._made if made[0] == pod.uid]:
                del self._made[made]
        self._enqueue_claims_of(pod)

    def _enqueue_claims_of(self, pod: PodState) -> None:
        keys = {f"{pod.namespace}/{name}" for name in claim_names(pod)}
        with self._lock:
            keys |= self._owned.get(pod.uid, set())
        for key in sorted(keys):
            self.queue.add(CLAIM_PREFIX + key)

    def _group_changed(self, old: GroupState | None, group: GroupState) -> None:
        if not group.group.resource_claims:
            return
        if old is not None or self.pod_groups.has_synced():  # The first list is history, not activity.
            other = other_claim_writer(old, group, ours=self.client.field_manager)
            if other is not None:
                self._defer(other, f"PodGroup {group.key}")
        self.queue.add(GROUP_PREFIX + group.key)
        # Its members may be waiting for it (or for its claim), and a new record may leave a duplicate behind.
        self._enqueue_members(group)
        for claim in sorted(self._claims_of_group(group).values(), key=lambda claim: claim.key):
            self.queue.add(CLAIM_PREFIX + claim.key)

    def _group_deleted(self, group: GroupState) -> None:
        with self._lock:
            for made in [made for made in self._made if made[0] == group.uid]:
                del self._made[made]
        # The claims reserved for it are released (a scan: a group ends once, next to many claim events).
        for claim in self.claims.store.values():
            if claim.meta.namespace == group.namespace and any(
                ref.resource == "podgroups" and ref.name == group.name for ref in claim.reserved_for
            ):
                self.queue.add(CLAIM_PREFIX + claim.key)
        self._enqueue_members(group)

    def _enqueue_members(self, group: GroupState) -> None:
        for pod in self.pods.store.values():
            if pod.namespace == group.namespace and pod.group_name == group.name:
                self.queue.add(POD_PREFIX + pod.key)

    def _claim_changed(self, old: model.ResourceClaim | None, claim: model.ResourceClaim) -> None:
        self.queue.add(CLAIM_PREFIX + claim.key)
        group_owner = controller_of(claim, POD_GROUP)
        if group_owner is not None:
            with self._lock:
                self._made.pop(
                    (
                        str(group_owner.get("uid") or ""),
                        claim.meta.annotations.get(podclaims.POD_CLAIM_NAME_ANNOTATION, ""),
                    ),
                    None,
                )
            self.queue.add(f"{GROUP_PREFIX}{claim.meta.namespace}/{group_owner.get('name')}")
            if old is None:
                # As for a pod's: a new claim of the group may make an earlier sibling a duplicate to delete.
                for sibling in self.claims.store.values():
                    uid = str(group_owner.get("uid") or "")
                    if sibling.key != claim.key and controlled_by(sibling, uid, POD_GROUP):
                        self.queue.add(CLAIM_PREFIX + sibling.key)
        owner = controller_of(claim)
        if owner is not None:
            uid = str(owner.get("uid") or "")
            with self._lock:
                siblings = set(self._owned.setdefault(uid, set()))
                self._owned[uid].add(claim.key)
                self._made.pop((uid, claim.meta.annotations.get(podclaims.POD_CLAIM_NAME_ANNOTATION, "")), None)
            self.queue.add(f"{POD_PREFIX}{claim.meta.namespace}/{owner.get('name')}")
            if old is None:
                # A new claim of the pod may be the one its status records, which makes an earlier
                # sibling (kube-controller-manager's, made in the same moment) a duplicate to delete.
                for key in sorted(siblings - {claim.key}):
                    self.queue.add(CLAIM_PREFIX + key)
        if claim.allocation is not None and (old is None or old.allocation is None):
            # A bound pod may be waiting for this claim to be reserved for it. A scan, not an
            # index: a claim becomes allocated once, next to many pod events.
            for pod in self.pods.store.values():
                if pod.namespace == claim.meta.namespace and pod.pod.node_name and claim.meta.name in claim_names(pod):
                    self.queue.add(POD_PREFIX + pod.key)

    def _claim_deleted(self, claim: model.ResourceClaim) -> None:
        with self._lock:
            self._finalizer_pending.discard(claim.meta.uid)
        owner = controller_of(claim)
        if owner is not None:
            uid = str(owner.get("uid") or "")
            with self._lock:
                owned = self._owned.get(uid, set())
                owned.discard(claim.key)
                if not owned:
                    self._owned.pop(uid, None)
            # The pod may need the claim made again (it was deleted while the pod still runs).
            self.queue.add(f"{POD_PREFIX}{claim.meta.namespace}/{owner.get('name')}")
        group_owner = controller_of(claim, POD_GROUP)
        if group_owner is not None:
            # So may the PodGroup.
            self.queue.add(f"{GROUP_PREFIX}{claim.meta.namespace}/{group_owner.get('name')}")

    def _template_changed(self, raw: dict[str, Any]) -> None:
        namespace, name = _split(informer.key_of(raw))
        for pod in self.pods.store.values():
            if pod.namespace == namespace and any(
                entry.resource_claim_template_name == name for entry in pod.pod.resource_claims
            ):
                self.queue.add(POD_PREFIX + pod.key)

    def _defer(self, manager: str, where: str) -> None:
        """Another claim controller records claims: stop writing for good, and say so once (log line and metric)."""
        with self._lock:
            if self._deferring_to is not None:
                return
            self._deferring_to = manager
        self.metrics.deferring.set(1)
        log.warning(
            "claim controller: %r recorded claims in %s's status.resourceClaimStatuses, so another claim "
            "controller (kube-controller-manager's resourceclaim controller) is running: dractl's claim controller "
            "stops writing; leave claims out of --controllers, or run kube-controller-manager with "
            "--controllers=*,-resource-claim-controller",
            manager,
            where,
        )

    def _writable(self) -> None:
        """Raise `Deferred` once another claim controller was seen: checked before every write, so a sync under way
        when it is seen stops before its next write."""
        if self.deferring_to is not None:
            raise Deferred(self.deferring_to)

    @property
    def deferring_to(self) -> str | None:
        """The field manager of the other claim controller this one stopped writing for, or None."""
        with self._lock:
            return self._deferring_to

    # --- Syncs ------------------------------------------------------------------------------

    def sync(self, key: str) -> None:
        """Sync one queue key (`pod:`, `claim:` or `podgroup:<ns>/<name>`). Raises to have the key retried. Writes
        nothing once another claim controller was seen (`deferring_to`)."""
        kind, _, rest = key.partition(":")
        namespace, name = _split(rest)
        try:
            self._writable()
            if kind == "pod":
                self.sync_pod(namespace, name)
            elif kind == "claim":
                self.sync_claim(namespace, name)
            elif kind == "podgroup":
                self.sync_group(namespace, name)
            else:
                log.error("claim controller: ignoring the malformed queue key %r", key)
        except Deferred:
            return

    def _claims_of(self, pod: PodState, group: GroupState | None = None) -> dict[str, model.ResourceClaim]:
        """By name, the cached claims the pod's plan reads: those it names or records, those it controls, and the
        ones of its PodGroup it uses."""
        names = [*claim_names(pod), *group_claim_names(pod, group)]
        with self._lock:
            keys = {f"{pod.namespace}/{name}" for name in names} | self._owned.get(pod.uid, set())
        return self._cached(keys)

    def _claims_of_group(self, group: GroupState) -> dict[str, model.ResourceClaim]:
        """By name, the cached claims a PodGroup's plan reads: those it records, and those it controls (a scan of
        its namespace: groups are few)."""
        keys = {f"{group.namespace}/{name}" for name in group.claim_statuses.values() if name}
        for claim in self.claims.store.values():
            if claim.meta.namespace == group.namespace and controlled_by(claim, group.uid, POD_GROUP):
                keys.add(claim.key)
        return self._cached(keys)

    def _cached(self, keys: Iterable[str]) -> dict[str, model.ResourceClaim]:
        found: dict[str, model.ResourceClaim] = {}
        for key in keys:
            claim = self.claims.store.get(key)
            if claim is not None:
                found[claim.meta.name] = claim
        return found

    def _group_of(self, pod: PodState) -> GroupState | None:
        """The cached PodGroup the pod joins, or None (it joins none, it does not exist, or PodGroups are not
        served)."""
        if not pod.group_name:
            return None
        return self.pod_groups.store.get(f"{pod.namespace}/{pod.group_name}")

    def sync_pod(self, namespace: str, name: str) -> None:
        """Create and record the pod's template claims (its PodGroup's claims: record the group's), and reserve
        allocated claims for it, or for its PodGroup, if it is bound.

        Idempotent: over unchanged state it writes nothing. Raises `RetryLater` (a template is
        missing, a claim is full) or `ApiError` (a write failed, e.g. 409) to be retried, and
        `Deferred` instead of any write once another claim controller was seen. A
        template the model refuses gets a Warning Event and no retry (fixing it syncs the pod).
        """
        pod = self.pods.store.get(f"{namespace}/{name}")
        if pod is None or not pod.pod.resource_claims:
            return
        group = self._group_of(pod)
        claims = self._claims_of(pod, group)
        plan = plan_pod(pod, claims, group=group)
        problems: list[str] = []
        target = _Target(
            namespace=namespace,
            uid=pod.uid,
            ref=events.ObjectRef.of(pod.pod.meta, api_version="v1", kind="Pod"),
            where=f"pod {pod.key}",
            body=lambda entry, template: claim_body(pod, pod_claim_name=entry, template=template),
        )
        recorded, failure = self._make_claims(plan, target, problems)
        entries = status_entries(pod, recorded)
        if entries is not None:
            self._writable()
            self.client.patch(
                kube_client.PODS,
                name,
                namespace=namespace,
                subresource="status",
                patch={
                    "metadata": {"resourceVersion": pod.pod.meta.resource_version},
                    "status": {"resourceClaimStatuses": entries},
                },
            )
        if failure is not None:
            raise failure
        for claim_name in reservations_to_add(pod, claims, group=group):
            problem = self._reserve(claims[claim_name], {"resource": "pods", "name": pod.name, "uid": pod.uid}, target)
            if problem:
                problems.append(problem)
        if group is not None:
            for claim_name in group_reservations_to_add(pod, group, claims):
                problem = self._reserve(claims[claim_name], group_consumer(group), target)
                if problem:
                    problems.append(problem)
        if problems:
            raise RetryLater("; ".join(problems))

    def sync_group(self, namespace: str, name: str) -> None:
        """Create and record a PodGroup's template claims (one per entry and group, as upstream), in its
        `status.resourceClaimStatuses`. Idempotent and raising as `sync_pod`; a Warning Event on the PodGroup
        names a missing or invalid template."""
        group = self.pod_groups.store.get(f"{namespace}/{name}")
        if group is None or not group.group.resource_claims:
            return
        plan = plan_group(group, self._claims_of_group(group))
        problems: list[str] = []
        target = _Target(
            namespace=namespace,
            uid=group.uid,
            ref=events.ObjectRef.of(group.group.meta, api_version=kube_client.POD_GROUPS.api_version, kind="PodGroup"),
            where=f"PodGroup {group.key}",
            body=lambda entry, template: group_claim_body(group, pod_claim_name=entry, template=template),
        )
        recorded, failure = self._make_claims(plan, target, problems)
        entries = merged_statuses(group.claim_statuses, [entry.name for entry in group.group.resource_claims], recorded)
        if entries is not None:
            self._writable()
            self.client.patch(
                kube_client.POD_GROUPS,
                name,
                namespace=namespace,
                subresource="status",
                patch={
                    "metadata": {"resourceVersion": group.group.meta.resource_version},
                    "status": {"resourceClaimStatuses": entries},
                },
            )
        if failure is not None:
            raise failure
        if problems:
            raise RetryLater("; ".join(problems))

    def _make_claims(
        self, plan: PodPlan, target: _Target, problems: list[str]
    ) -> tuple[dict[str, str], kube_client.ApiError | None]:
        """Create the claims `plan` asks for; returns what to record (entry -> claim name: adopted, made before and
        made now) and the first failed write. Problems that may go away are appended to `problems`."""
        recorded = dict(plan.adopt)
        failure: kube_client.ApiError | None = None
        for item in plan.create:
            # The cache lags behind our own creates: a claim made by an earlier sync that the
            # informer has not shown yet is recorded, not made again. (After a restart the first
            # list has every claim; a claim kube-controller-manager made at the same moment as
            # ours is the duplicate `plan_claim` deletes, as upstream.)
            with self._lock:
                made = self._made.get((target.uid, item.pod_claim_name))
            if made is not None:
                recorded[item.pod_claim_name] = made
                continue
            try:
                claim_name = recorded[item.pod_claim_name] = self._create_claim(target, item)
            except RetryLater as error:
                problems.append(str(error))
            except InvalidInput as error:
                log.warning("%s: %s", target.where, error)
            except kube_client.ApiError as error:
                failure = failure or error  # Record the claims made so far first, then retry.
            else:
                with self._lock:
                    self._made[(target.uid, item.pod_claim_name)] = claim_name
        return recorded, failure

    def _template(self, target: _Target, item: Create) -> dict[str, Any]:
        """The raw template, from the cache or else the API.

        Raises `RetryLater` (it does not exist) or `InvalidInput` (the model refuses it), each after
        a Warning Event on the pod or PodGroup naming the template and the field.
        """
        name = item.template_name
        raw = self.templates.store.get(f"{target.namespace}/{name}")
        if raw is not None:
            return raw
        where = f"{target.where} spec.resourceClaims[{item.pod_claim_name}].resourceClaimTemplateName"
        try:
            fetched = self.client.get(kube_client.RESOURCE_CLAIM_TEMPLATES, name, namespace=target.namespace)
            kube_client.decode(fetched, strict=True)
        except kube_client.NotFound:
            message = f"ResourceClaimTemplate {target.namespace}/{name} does not exist ({where})"
            self._warn(target, FAILED_CREATION, message)
            raise RetryLater(message) from None
        except kube_client.BadObject as error:
            message = f"ResourceClaimTemplate {target.namespace}/{name} is invalid ({where}): {error}"
            self._warn(target, FAILED_CREATION, message)
            raise InvalidInput(message) from None
        return fetched

    def _create_claim(self, target: _Target, item: Create) -> str:
        """Create the claim for one entry from its template; returns the name the API server gave it."""
        body = target.body(item.pod_claim_name, self._template(target, item))
        try:
            self._writable()
            created = self.client.create(kube_client.RESOURCE_CLAIMS, body, namespace=target.namespace)
        except kube_client.ApiError as error:
            self.metrics.creates.labels(status="error").inc()
            self._warn(
                target,
                FAILED_CREATION,
                f"creating a ResourceClaim for pod claim {item.pod_claim_name} from ResourceClaimTemplate "
                f"{target.namespace}/{item.template_name}: {error}",
            )
            raise
        self.metrics.creates.labels(status="success").inc()
        claim_name = str(created["metadata"]["name"])
        log.info(
            "created ResourceClaim %s/%s for %s claim %s",
            target.namespace,
            claim_name,
            target.where,
            item.pod_claim_name,
        )
        return claim_name

    def _reserve(self, claim: model.ResourceClaim, consumer: dict[str, str], target: _Target) -> str | None:
        """Add `consumer` to the claim's `reservedFor`; returns a problem (after a Warning Event on `target`) when
        the list is full."""
        if len(claim.reserved_for) >= limits.MAX_RESERVED_FOR:
            kind = "PodGroup" if consumer["resource"] == "podgroups" else "pod"
            who = f"{kind} {claim.meta.namespace}/{consumer['name']}"
            message = (
                f"ResourceClaim {claim.key} already has {limits.MAX_RESERVED_FOR} entries in "
                f"status.reservedFor (the API's limit); {who} cannot be added"
            )
            self._warn(target, RESERVATION_FAILED, message)
            return message
        entries = [consumer_entry(ref) for ref in claim.reserved_for]
        entries.append(consumer)
        self._writable()
        self.client.patch(
            kube_client.RESOURCE_CLAIMS,
            claim.meta.name,
            namespace=claim.meta.namespace,
            subresource="status",
            patch={"metadata": {"resourceVersion": claim.meta.resource_version}, "status": {"reservedFor": entries}},
        )
        return None

    def _warn(self, target: _Target, reason: str, message: str) -> None:
        self._writable()
        self.recorder.event(target.ref, type=events.WARNING, reason=reason, message=message)

    def _lookup_pod(self, namespace: str, name: str) -> PodState | None:
        """The pod from the cache, else from a live GET (the cache may not have seen it yet); None when it is gone."""
        cached = self.pods.store.get(f"{namespace}/{name}")
        if cached is not None:
            return cached
        return self._live_pod(namespace, name)

    def _live_pod(self, namespace: str, name: str) -> PodState | None:
        """The pod as the API server has it now; None when it is gone."""
        try:
            raw = self.client.get(kube_client.PODS, name, namespace=namespace)
        except kube_client.NotFound:
            return None
        pod = decode_pod(raw)
        if pod is None:
            # It exists but the model refuses it: treat it as present and running, never as gone.
            meta = raw.get("metadata") or {}
            pod = PodState(
                pod=model.Pod(meta=model.ObjectMeta(name=name, namespace=namespace, uid=str(meta.get("uid") or "")))
            )
        return pod

    def _lookup_group(self, namespace: str, name: str, *, live: bool = False) -> GroupState | None:
        """The PodGroup from the cache (unless `live`), else from a live GET; None when it is gone."""
        cached = None if live else self.pod_groups.store.get(f"{namespace}/{name}")
        if cached is not None:
            return cached
        try:
            raw = self.client.get(kube_client.POD_GROUPS, name, namespace=namespace)
        except kube_client.NotFound:
            return None
        group = decode_group(raw)
        if group is None:
            # It exists but the model refuses it: treat it as present, never as gone.
            meta = raw.get("metadata") or {}
            group = GroupState(
                group=model.PodGroup(
                    meta=model.ObjectMeta(name=name, namespace=namespace, uid=str(meta.get("uid") or "")),
                    api=model.PodGroupApi.WORKLOAD,
                )
            )
        return group

    def _groups_of(self, claim: model.ResourceClaim, *, live: bool = False) -> dict[str, GroupState | None] | None:
        """The PodGroups the claim refers to (its `podgroups` entries, its controlling group) by name, None when
        they are gone; None for all when the server does not serve PodGroups."""
        if not self.pod_groups_served:
            return None
        names = {
            ref.name
            for ref in claim.reserved_for
            if ref.resource == "podgroups" and ref.api_group == POD_GROUP.api_group
        }
        owner = controller_of(claim, POD_GROUP)
        if owner is not None and owner.get("name"):
            names.add(str(owner["name"]))
        return {name: self._lookup_group(claim.meta.namespace, name, live=live) for name in sorted(names)}

    def sync_claim(self, namespace: str, name: str) -> None:
        """Clean up one claim: drop reservations of gone or finished pods and of gone PodGroups, deallocate,
        unprotect, delete.

        Idempotent: over unchanged state it writes nothing. Raises `ApiError` (409 when the
        claim changed since it was read) to be retried, and `Deferred` instead of any write once
        another claim controller was seen.
        """
        claim = self.claims.store.get(f"{namespace}/{name}")
        if claim is None:
            return
        names = {ref.name for ref in claim.reserved_for if ref.resource == "pods" and not ref.api_group}
        owner = controller_of(claim)
        if owner is not None and owner.get("name"):
            names.add(str(owner["name"]))
        pods = {pod_name: self._lookup_pod(namespace, pod_name) for pod_name in sorted(names)}
        with self._lock:
            if claim.allocation is not None:
                self._finalizer_pending.discard(claim.meta.uid)  # Allocated again: nothing is pending.
            pending = claim.meta.uid in self._finalizer_pending
        owner_pod = pods.get(str(owner["name"])) if owner is not None and owner.get("name") else None
        existing = self._claims_of(owner_pod) if owner_pod is not None else {}
        groups = self._groups_of(claim)
        group_owner = controller_of(claim, POD_GROUP)
        owner_group = (groups or {}).get(str(group_owner.get("name"))) if group_owner is not None else None
        if owner_group is not None:
            existing = self._claims_of_group(owner_group)
        plan = plan_claim(claim, pods, groups=groups, existing=existing, finalizer_pending=pending)
        if plan.delete and owner is not None and owner_pod is not None:
            if not _pod_gone_or_done(owner_pod, str(owner.get("uid") or "")):
                # A duplicate by the cached pod: confirm with the pod as the API has it. kube-controller-manager
                # may have just recorded this very claim, and deleting it would make both controllers start over.
                pods[str(owner["name"])] = self._live_pod(namespace, str(owner["name"]))
                plan = plan_claim(claim, pods, groups=groups, existing=existing, finalizer_pending=pending)
        if plan.delete and owner_group is not None:
            # A duplicate by the cached PodGroup: confirm with the group as the API has it (as for pods).
            groups = self._groups_of(claim, live=True)
            plan = plan_claim(claim, pods, groups=groups, existing=existing, finalizer_pending=pending)
        if plan.empty:
            return
        version = claim.meta.resource_version
        if plan.status_write:
            status: dict[str, Any] = {}
            if plan.reserved_for is not None:
                status["reservedFor"] = [consumer_entry(ref) for ref in plan.reserved_for] or None
            if plan.deallocate:
                # Devices' status entries describe allocated devices: they go with the allocation.
                status["allocation"] = None
                status["devices"] = None
            self._writable()
            stored = self.client.patch(
                kube_client.RESOURCE_CLAIMS,
                name,
                namespace=namespace,
                subresource="status",
                patch={"metadata": {"resourceVersion": version}, "status": status},
            )
            version = str(stored["metadata"]["resourceVersion"])
            if plan.deallocate:
                self.metrics.deallocations.inc()
                log.info("deallocated ResourceClaim %s/%s: nothing reserves it", namespace, name)
        if plan.remove_finalizer:
            with self._lock:
                self._finalizer_pending.add(claim.meta.uid)
            self._writable()
            unprotected = finalizers.change(
                self.client,
                kube_client.RESOURCE_CLAIMS,
                name,
                namespace=namespace,
                resource_version=version,
                remove=DELETE_PROTECTION_FINALIZER,
            )
            if unprotected is not None:
                version = str(unprotected["metadata"]["resourceVersion"])
            with self._lock:
                self._finalizer_pending.discard(claim.meta.uid)
        if plan.delete:
            try:
                self._writable()
                self.client.delete(
                    kube_client.RESOURCE_CLAIMS, name, namespace=namespace, uid=claim.meta.uid, resource_version=version
                )
            except kube_client.NotFound:
                return  # Gone already (the garbage collector or another controller was faster).
            log.info("deleted ResourceClaim %s/%s: its owner no longer needs it", namespace, name)
