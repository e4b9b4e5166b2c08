"""The scheduler's pure decisions: which claims a pod uses, which nodes may host it, what to write.

What it does: decodes a raw pod into what the scheduler needs (`PodInfo`: the claim
controller's `PodState`, the node-filter requirements from `nodefit`, the current
`PodScheduled` condition); resolves the pod's claims (`resolve_claims`: a pod waits until every
claim exists); splits them into claims already allocated (they pin the node and get the pod
added to `reservedFor`) and claims to allocate (`split_claims`); filters nodes (`feasible_nodes`:
`nodefit`, then `pin` to the node selectors of allocated claims); words the explanation of an
unschedulable pod (`unschedulable_message`); and builds every body the scheduler writes (the
allocation with `reservedFor`, a reservation, the undo of those, the `PodScheduled` condition,
the Binding), whether the finalizer is still needed, and whether a pod read just before its
binding still records the claims it was scheduled with (`changed_since`).

What it must not do: talk to the API, touch the allocator, read a clock other than through its
arguments, or keep state. Every function here is pure and may be called any number of times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dractl import alloc, model
from dractl.controller import claims, nodefit
from dractl.kube import client as kube_client
from dractl.model import encode, limits, nodes

POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
SCHEDULER_ERROR = "SchedulerError"
"""PodScheduled reason when an attempt failed for another reason than fit: a write failed (kube-scheduler's)."""
FAILED_SCHEDULING = "FailedScheduling"
"""Warning Event reason on a pod that could not be scheduled (kube-scheduler's reason)."""
SCHEDULED = "Scheduled"
"""Normal Event reason on a pod once it is bound (kube-scheduler's reason)."""
CANNOT_ALLOCATE = "cannot allocate all claims"
"""A node's reason when it passed the node filter but the allocator found no devices there (upstream's wording)."""
CLAIM_NOT_ON_NODE = "resourceclaim not available on the node"
"""A node's reason when an allocated claim's node selector excludes it (upstream's wording)."""


# --- Pods ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    """A pod condition as the scheduler compares it (timestamps left out)."""

    status: str
    reason: str = ""
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod as the scheduler sees it.

    `needs` is what the node filter reads; it is None when the pod does not matter for
    scheduling (another scheduler's pod that is not bound) or when it cannot be read, and then
    `invalid` says why, naming the pod and the field. `conditions` holds the raw
    `status.conditions` (needed to write the list back with one entry changed) and `scheduled`
    the current `PodScheduled` condition.
    """

    state: claims.PodState
    scheduler_name: str
    needs: nodefit.PodNeeds | None = None
    invalid: str | None = None
    scheduled: Condition | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return self.state.key

    @property
    def namespace(self) -> str:
        return self.state.namespace

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def uid(self) -> str:
        return self.state.uid

    @property
    def node_name(self) -> str:
        return self.state.pod.node_name

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def deleting(self) -> bool:
        return self.state.deleting

    @property
    def uses_node(self) -> bool:
        """Bound and not finished: its requests count toward its node's usage (as kube-scheduler counts them)."""
        return bool(self.node_name) and self.state.phase not in ("Succeeded", "Failed")

    def pending_for(self, scheduler_name: str) -> bool:
        """Waiting to be scheduled by `scheduler_name`: its pod, not bound, not finished, not being deleted."""
        return self.scheduler_name == scheduler_name and not self.node_name and not self.done and not self.deleting


def scheduling_changed(old: PodInfo, new: PodInfo) -> bool:
    """Whether `new` differs from `old` in anything scheduling reads, not only in its status conditions (such as
    the scheduler's own `PodScheduled` write, which must not undo the backoff of a failed attempt) and its
    resourceVersion. Pure."""

    def read(info: PodInfo) -> tuple[object, ...]:
        pod = info.state.pod
        unversioned = dataclasses.replace(pod, meta=dataclasses.replace(pod.meta, resource_version=""))
        return (dataclasses.replace(info.state, pod=unversioned), info.scheduler_name, info.needs, info.invalid)

    return read(old) != read(new)


def _scheduled_condition(conditions: Sequence[Mapping[str, Any]]) -> Condition | None:
    for entry in conditions:
        if entry.get("type") == POD_SCHEDULED:
            return Condition(
                status=str(entry.get("status") or ""),
                reason=str(entry.get("reason") or ""),
                message=str(entry.get("message") or ""),
            )
    return None


def decode_pod(raw: Mapping[str, Any], *, scheduler_name: str) -> PodInfo | None:
    """One raw pod as a `PodInfo`, for the scheduler called `scheduler_name`. Pure apart from logging.

    The node-filter requirements are read only for pods that matter: bound pods (their
    requests use their node) and unbound pods of this scheduler. A pod of this scheduler that
    the model or the node filter refuses still comes back, with `invalid` saying why, so it
    is reported on the pod instead of vanishing; any other pod the model refuses is None.
    """
    spec = raw.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    ours = spec.get("schedulerName") == scheduler_name and not spec.get("nodeName")
    state = claims.decode_pod(raw)
    invalid: str | None = None
    if state is None:
        if not ours:
            return None
        meta = raw.get("metadata") or {}
        pod = model.Pod(
            meta=model.ObjectMeta(
                name=str(meta.get("name") or ""),
                namespace=str(meta.get("namespace") or ""),
                uid=str(meta.get("uid") or ""),
                resource_version=str(meta.get("resourceVersion") or ""),
                deletion_timestamp=meta.get("deletionTimestamp") or None,
            ),
            scheduler_name=scheduler_name,
        )
        state = claims.PodState(pod=pod, phase=str((raw.get("status") or {}).get("phase") or ""))
        try:
            kube_client.decode(raw, strict=True)
            invalid = f"pod {state.key} cannot be read"
        except kube_client.BadObject as error:
            invalid = f"pod {state.key} is invalid: {error}"
    status = raw.get("status")
    status = status if isinstance(status, Mapping) else {}
    entries = status.get("conditions")
    conditions = tuple(entry for entry in entries if isinstance(entry, Mapping)) if isinstance(entries, list) else ()
    needs: nodefit.PodNeeds | None = None
    if invalid is None and (ours or state.pod.node_name):
        try:
            needs = nodefit.PodNeeds.from_raw(raw)
        except nodefit.Invalid as error:
            if ours:
                invalid = str(error)
    return PodInfo(
        state=state,
        scheduler_name=state.pod.scheduler_name,
        needs=needs,
        invalid=invalid,
        scheduled=_scheduled_condition(conditions),
        conditions=conditions,
    )


# --- Claims --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """A pod's claims in the pod's order, or why it must wait for them (`waiting`) or cannot use them (`problem`).

    Waiting goes away by itself (a claim is created, a status is recorded); a problem needs a
    person (a claim the model refuses, a claim controlled by another pod). `claim` names the
    claim (`namespace/name`) whose change may end the wait or the problem; "" when the pod
    waits for its own status (a claim made from a template is not recorded yet).
    """

    claims: tuple[model.ResourceClaim, ...] = ()
    waiting: str | None = None
    problem: str | None = None
    claim: str = ""


def resolve_claims(
    pod: PodInfo, claims_by_name: Mapping[str, model.ResourceClaim], *, bad: Mapping[str, str] | None = None
) -> Resolved:
    """The claims `pod` uses, given its namespace's claims by name (and `bad`: claim name -> why the model refuses it).

    As kube-scheduler's PreEnqueue: every claim must exist and not be being deleted, and a claim
    made from a template must be the one recorded in `pod.status.resourceClaimStatuses` and be
    controlled by the pod. A pod claim recorded as not needed is skipped. Pure.
    """
    found: list[model.ResourceClaim] = []
    for entry in pod.state.pod.resource_claims:
        field = f"spec.resourceClaims[{entry.name}]"
        if entry.resource_claim_name:
            name = entry.resource_claim_name
        elif entry.name in pod.state.claim_statuses:
            recorded = pod.state.claim_statuses[entry.name]
            if recorded is None:
                continue
            name = recorded
        else:
            return Resolved(waiting=f"waiting for the ResourceClaim of pod claim {entry.name} to be created")
        if bad and name in bad:
            return Resolved(
                problem=f"ResourceClaim {pod.namespace}/{name} ({field}) is invalid: {bad[name]}",
                claim=f"{pod.namespace}/{name}",
            )
        claim = claims_by_name.get(name)
        if claim is None:
            return Resolved(
                waiting=f"waiting for ResourceClaim {pod.namespace}/{name} ({field}) to exist",
                claim=f"{pod.namespace}/{name}",
            )
        if claim.meta.deletion_timestamp is not None:
            return Resolved(waiting=f"ResourceClaim {claim.key} ({field}) is being deleted", claim=claim.key)
        if entry.resource_claim_template_name and not claims.controlled_by(claim, pod.uid):
            return Resolved(
                problem=f"ResourceClaim {claim.key} ({field}) was not made for this pod (another controller owns it)",
                claim=claim.key,
            )
        if all(other.meta.name != claim.meta.name for other in found):
            found.append(claim)
    return Resolved(claims=tuple(found))


def reserved_for(claim: model.ResourceClaim, pod_uid: str) -> bool:
    """Whether `claim.status.reservedFor` lists the pod with `pod_uid`. Pure."""
    return any(ref.uid == pod_uid and ref.resource == "pods" and not ref.api_group for ref in claim.reserved_for)


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    """A pod's claims by what scheduling does with them.

    `allocated` pin the node; `reserve` (a subset of them) still need the pod in
    `reservedFor`; `allocate` have no allocation yet. `problem` is set when a claim cannot take
    the pod (its `reservedFor` is full).
    """

    allocated: tuple[model.ResourceClaim, ...] = ()
    reserve: tuple[model.ResourceClaim, ...] = ()
    allocate: tuple[model.ResourceClaim, ...] = ()
    problem: str | None = None


def split_claims(pod: PodInfo, resolved: Sequence[model.ResourceClaim]) -> Split:
    """Split `resolved` into allocated claims (and those of them still to reserve) and claims to allocate. Pure."""
    allocated: list[model.ResourceClaim] = []
    reserve: list[model.ResourceClaim] = []
    allocate: list[model.ResourceClaim] = []
    for claim in resolved:
        if claim.allocation is None:
            allocate.append(claim)
            continue
        allocated.append(claim)
        if reserved_for(claim, pod.uid):
            continue
        if len(claim.reserved_for) >= limits.MAX_RESERVED_FOR:
            return Split(
                problem=(
                    f"ResourceClaim {claim.key} already has {limits.MAX_RESERVED_FOR} entries in "
                    "status.reservedFor (the API's limit)"
                )
            )
        reserve.append(claim)
    return Split(allocated=tuple(allocated), reserve=tuple(reserve), allocate=tuple(allocate))


# --- Nodes ---------------------------------------------------------------------------------


def feasible_nodes(
    needs: nodefit.PodNeeds,
    node_infos: Sequence[nodefit.NodeInfo],
    *,
    used: Mapping[str, nodefit.Usage],
    allocated: Sequence[model.ResourceClaim] = (),
) -> tuple[list[str], dict[str, str]]:
    """The nodes that may host the pod (sorted by name) and, for every other node, why not. Pure.

    A node must pass `nodefit` (name, selector, affinity, taints, requests) and lie inside
    the node selector of every claim the pod uses that is already allocated (a claim whose
    devices are usable everywhere has none). The scheduler computes the same with the
    `nodefit` answers cached (`pin` does the second step).
    """
    feasible, reasons = nodefit.filter_nodes(needs, node_infos, used)
    labels = {info.name: info.labels for info in node_infos}
    return pin(feasible, dict(reasons), labels=labels, allocated=allocated)


def pin(
    feasible: Sequence[str],
    reasons: dict[str, str],
    *,
    labels: Mapping[str, Mapping[str, str]],
    allocated: Sequence[model.ResourceClaim],
) -> tuple[list[str], dict[str, str]]:
    """Keep the nodes of `feasible` inside every allocated claim's node selector; the others get a reason in
    `reasons` (changed in place and returned). `labels` has every node's labels by name. Pure apart from
    `reasons`."""
    selectors = [
        claim.allocation.node_selector
        for claim in allocated
        if claim.allocation is not None and claim.allocation.node_selector is not None
    ]
    kept: list[str] = []
    for name in feasible:
        if all(nodes.selector_matches(selector, name=name, labels=labels.get(name, {})) for selector in selectors):
            kept.append(name)
        else:
            reasons[name] = CLAIM_NOT_ON_NODE
    return sorted(kept), reasons


def _reason_text(reason: alloc.Reason) -> str:
    where = f"ResourceClaim {reason.claim}"
    if reason.request:
        where += f" request {reason.request}"
    return f"{where}: {reason.message}"


def unschedulable_message(
    *,
    node_reasons: Mapping[str, str],
    total: int,
    outcome: Sequence[alloc.Reason] = (),
) -> str:
    """kube-scheduler's "0/N nodes are available: ..." summary, then the allocator's explanation per claim. Pure."""
    message = nodefit.summary(node_reasons, total)
    explained = "; ".join(dict.fromkeys(_reason_text(reason) for reason in outcome))
    return f"{message} {explained}" if explained else message


def unsupported_message(pod: PodInfo) -> str | None:
    """Why dractl refuses to schedule `pod` at all (invalid input, features it does not filter on), or None. Pure.

    A pod asking for what dractl cannot check (inter-pod affinity, spread constraints, ...)
    is not scheduled with the requirement silently ignored: it is reported on the pod.
    """
    if pod.invalid is not None:
        return pod.invalid
    if pod.needs is not None and pod.needs.unsupported:
        features = "; ".join(pod.needs.unsupported)
        return (
            f"dractl does not schedule pods that need what it cannot check: {features}. "
            "Remove it, or use another scheduler (spec.schedulerName)."
        )
    return None


# --- Writes --------------------------------------------------------------------------------


def consumer(pod: PodInfo) -> dict[str, str]:
    """The pod's `reservedFor` entry. Pure."""
    return {"resource": "pods", "name": pod.name, "uid": pod.uid}


def needs_finalizer(claim: model.ResourceClaim) -> bool:
    """Whether the delete-protection finalizer is still to be added before the claim is allocated. Pure."""
    return claims.DELETE_PROTECTION_FINALIZER not in claim.meta.finalizers


def finalizer_by_patch(claim: model.ResourceClaim) -> bool:
    """Whether the finalizer may be added with a merge patch (`kube.finalizers.add_with_patch`, one request): the
    claim has no opaque configuration, the only part of a claim the API server keeps as raw bytes, which a patch's
    JSON round trip would re-encode (then the API server refuses the write: spec is immutable). Otherwise it is
    written with `kube.finalizers.change` (a protobuf read and PUT that keep every stored byte). Pure."""
    return not claim.spec.config


def allocation_patch(
    claim: model.ResourceClaim, allocation: model.AllocationResult, pod: PodInfo, *, resource_version: str
) -> dict[str, Any]:
    """The status merge patch writing `allocation` and adding the pod to `reservedFor`, at `resource_version`. Pure."""
    entries = [claims.consumer_entry(ref) for ref in claim.reserved_for if ref.uid != pod.uid]
    entries.append(consumer(pod))
    return {
        "metadata": {"resourceVersion": resource_version},
        "status": {"allocation": encode.allocation_result(allocation), "reservedFor": entries},
    }


def reservation_patch(claim: model.ResourceClaim, pod: PodInfo) -> dict[str, Any]:
    """The status merge patch adding the pod to an allocated claim's `reservedFor`. Pure."""
    entries = [claims.consumer_entry(ref) for ref in claim.reserved_for if ref.uid != pod.uid]
    entries.append(consumer(pod))
    return {"metadata": {"resourceVersion": claim.meta.resource_version}, "status": {"reservedFor": entries}}


@dataclasses.dataclass(frozen=True, slots=True)
class Undo:
    """How to take back what scheduling wrote to one claim: a status patch (optional), then whether the
    delete-protection finalizer goes.

    `deallocates` is true when the status patch clears the allocation, so the allocator can
    give the devices back once it succeeded.
    """

    status: dict[str, Any] | None = None
    remove_finalizer: bool = False
    deallocates: bool = False


def undo(claim: model.ResourceClaim, pod_uid: str, *, allocated_here: bool, finalizer_added: bool) -> Undo:
    """What to write to `claim` as it is now to take back this pod's scheduling. Pure.

    The pod's `reservedFor` entry is removed; when the scheduler allocated the claim for this
    pod (`allocated_here`) and nobody else reserves it, the allocation goes too, and the
    finalizer if the scheduler added it. A claim someone else has meanwhile reserved keeps its
    allocation: that pod needs it.
    """
    keep = [ref for ref in claim.reserved_for if ref.uid != pod_uid]
    deallocate = allocated_here and claim.allocation is not None and not keep
    status: dict[str, Any] | None = None
    if deallocate:
        status = {"allocation": None, "reservedFor": None, "devices": None}
    elif len(keep) != len(claim.reserved_for):
        status = {"reservedFor": [claims.consumer_entry(ref) for ref in keep] or None}
    unallocated_after = claim.allocation is None or deallocate
    remove = finalizer_added and unallocated_after and claims.DELETE_PROTECTION_FINALIZER in claim.meta.finalizers
    return Undo(status=status, remove_finalizer=remove, deallocates=deallocate)


def condition_patch(pod: PodInfo, message: str, *, now: str, reason: str = UNSCHEDULABLE) -> dict[str, Any] | None:
    """The status merge patch setting `PodScheduled=False, reason, message`, or None when it is set already.

    `reason` is `Unschedulable` when no node can take the pod and `SchedulerError` when an
    attempt failed otherwise (a write failed, the pod changed under it); each attempt's outcome
    replaces the one before.

    The whole `status.conditions` list is written (a merge patch replaces lists), with the
    pod's resourceVersion as precondition so a concurrent change of another condition fails
    with 409 instead of being lost. `now` (RFC 3339) is the transition time when the status
    changes. Pure.
    """
    wanted = Condition(status="False", reason=reason, message=message)
    if pod.scheduled == wanted:
        return None
    entry: dict[str, Any] = {
        "type": POD_SCHEDULED,
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    conditions: list[dict[str, Any]] = []
    replaced = False
    for existing in pod.conditions:
        if existing.get("type") == POD_SCHEDULED:
            if existing.get("status") == "False" and existing.get("lastTransitionTime"):
                entry["lastTransitionTime"] = existing["lastTransitionTime"]
            conditions.append(entry)
            replaced = True
        else:
            conditions.append(dict(existing))
    if not replaced:
        conditions.append(entry)
    return {
        "metadata": {"resourceVersion": pod.state.pod.meta.resource_version},
        "status": {"conditions": conditions},
    }


def binding(pod: PodInfo, node: str, *, resource_version: str) -> dict[str, Any]:
    """The core/v1 Binding that assigns `pod` to `node`, with the pod's UID and `resource_version` as preconditions:
    the API server refuses it (409) if the pod changed since that version, so the pod is bound exactly as it was
    read then (with the claims it recorded then). Pure."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "resourceVersion": resource_version},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def scheduled_message(pod: PodInfo, node: str) -> str:
    """The `Scheduled` Event's message, word for word kube-scheduler's, so `kubectl describe pod` reads the same
    whichever scheduler bound the pod. Pure."""
    return f"Successfully assigned {pod.namespace}/{pod.name} to {node}"


def pod_claims(pod: claims.PodState) -> dict[str, str | None]:
    """Per pod claim, the claim it uses now: the name it gives, or the one its status records (None: recorded as
    not needed); a pod claim with no record yet is left out. Pure."""
    used: dict[str, str | None] = {}
    for entry in pod.pod.resource_claims:
        if entry.resource_claim_name:
            used[entry.name] = entry.resource_claim_name
        elif entry.name in pod.claim_statuses:
            used[entry.name] = pod.claim_statuses[entry.name]
    return used


def changed_since(decided: claims.PodState, live: claims.PodState | None) -> str | None:
    """Why the pod as the API has it now (`live`, None when it cannot be read) voids a decision made for `decided`,
    or None when it may be bound: the same pod (UID), not bound, not being deleted, recording exactly the claims
    the decision used. Pure."""
    if live is None:
        return f"pod {decided.key} can no longer be read"
    if live.uid != decided.uid:
        return f"pod {decided.key} was replaced (UID {live.uid}, not {decided.uid})"
    if live.deleting:
        return f"pod {decided.key} is being deleted"
    if live.pod.node_name:
        return f"pod {decided.key} is already bound to node {live.pod.node_name}"
    before, now = pod_claims(decided), pod_claims(live)
    for name in sorted(before.keys() | now.keys()):
        if before.get(name, "") != now.get(name, ""):
            was = before.get(name) or "no claim"
            is_now = now.get(name) or "no claim"
            return (
                f"pod {decided.key} records {is_now} for spec.resourceClaims[{name}] now, not {was} "
                "(another controller recorded its claim meanwhile)"
            )
    return None
