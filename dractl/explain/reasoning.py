"""Why a claim (or a pod's claims) is allocated where it is, or why it cannot be: pure reasoning.

What it does: takes the cluster's state as model values (`model.Objects`: classes, slices,
nodes, every ResourceClaim) and builds the snapshot `dractl simulate` builds for the API's
state (every allocated claim holds its devices, trusted as the scheduler trusts it), then:

- `explain_claim`: an allocated claim is shown where it is (nodes, devices per request, who
  reserves it); a pending one is handed to the allocator on its own, and either fits (the
  node and devices it would get now) or does not (the allocator's reasons per request:
  the class, how many devices pass each stage, the counter, capacity or constraint that
  stopped it, and "write instead" for a selector Kubernetes would reject);
- `explain_pod`: the pod's claims, as `resolve_pod_claims` finds them, explained together as
  a scheduler places them: the claims already allocated pin the node, the pod's
  `spec.nodeName` and `spec.nodeSelector` narrow it (`model.placement`, shared with
  simulate), and the pending claims are allocated jointly on one node;
- `explain_gang`: the PodGroup a pod joins, with its member pods, placed as one decision by the
  gang planner (`gang.plan`, as `dractl simulate` places gangs): the gang's line (where it fits,
  or why no domain of its topology key holds minCount pods), or why its group cannot be read.

Nothing is written anywhere: the allocator's commit lives and dies with this call.

What it must not do: talk to the API (the caller reads), print, or import `dractl.simulate`
(a sibling mode; what both need lives in `model.placement` and `alloc`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from dractl import alloc, config, gang, model
from dractl.model import limits, placement, podclaims


class State(enum.Enum):
    """What became of one claim; the value is how outputs spell it."""

    ALLOCATED = "allocated"  # status.allocation is set in the cluster
    FITS = "pending, fits"  # not allocated, but the allocator finds devices for it now
    DOES_NOT_FIT = "pending, does not fit"  # not allocated, and the allocator finds none
    MISSING = "missing"  # the pod names a claim or template that does not exist


class PodState(enum.Enum):
    """Where a pod's claims stand together; the value is how outputs spell it."""

    ALLOCATED = "all claims allocated"
    NO_CLAIMS = "no claims to allocate"  # spec.resourceClaims is empty, or names only claims not needed
    FITS = "claims fit"  # the pending claims fit on one node the pod may use
    BLOCKED = "cannot be scheduled"  # some claim cannot get devices on any node the pod may use


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request of a claim as the spec reads, or one `firstAvailable` subrequest ("req/sub"),
    with the devices it holds (or would get) and the reasons it does not fit.

    `count` is the device count, or None for allocationMode All; `capacity` the requested
    capacity by name, as written.
    """

    name: str
    device_class: str
    selectors: tuple[str, ...]
    count: int | None
    admin_access: bool = False
    capacity: Mapping[str, str] = dataclasses.field(default_factory=dict)
    devices: tuple[model.DeviceRequestAllocationResult, ...] = ()
    reasons: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """One claim explained. `nodes` are where its devices are (or would be) usable: None for
    every node, () when there are none (not allocated, or no known node matches).
    `reasons` are the claim-level reasons (request-level ones are on `requests`);
    `constraints` the spec's constraints as text ("matchAttribute <attr> over <requests>").

    A claim a pod will get from a template but that does not exist yet has `created` False,
    `name` its generateName and `template` the template it is explained from. A claim the pod
    names that does not exist has state `MISSING` and no requests.
    """

    namespace: str
    name: str
    state: State
    requests: tuple[Request, ...] = ()
    constraints: tuple[str, ...] = ()
    nodes: tuple[str, ...] | None = ()
    reserved_for: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    created: bool = True
    template: str | None = None
    pod_claim: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class Gang:
    """The PodGroup a pod joins, explained: its "namespace/name" and apiVersion, its member pods found (names, the
    pod itself included) and those bound to a node, whether it fits now (`fits`: at least minCount members placed
    in one domain; None when the group cannot be read), the members that do not fit where it fits (`left`), and
    its one line: where it fits or runs, why it does not fit (`gang.plan`'s reason), or why the group cannot be
    read."""

    name: str
    api: str
    members: tuple[str, ...]
    bound: tuple[str, ...]
    fits: bool | None
    line: str
    left: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Pod:
    """A pod's claims explained together. `candidates` are the nodes the pod may use as
    dractl reads them (None: any node); `node` is where its claims are or would be (None
    when that is not one node); `gang` its PodGroup's explanation when it joins one."""

    namespace: str
    name: str
    state: PodState
    node_name: str
    node_selector: Mapping[str, str]
    candidates: tuple[str, ...] | None
    node: str | None
    claims: tuple[Claim, ...]
    reasons: tuple[str, ...] = ()
    gang: Gang | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PodClaim:
    """One `spec.resourceClaims[]` entry resolved against the cluster (see `resolve_pod_claims`).

    `claim` is the ResourceClaim to explain: the existing one, or for a template whose claim
    is not created yet a stand-in named after its generateName with the template's spec
    (`created` False). None when it cannot exist: then `problem` says why and `name` is the
    claim (or template) the pod names.
    """

    pod_claim: str
    name: str
    claim: model.ResourceClaim | None
    created: bool = True
    template: str | None = None
    problem: str | None = None


def resolve_pod_claims(
    pod: model.Pod,
    *,
    claim_statuses: Mapping[str, str | None],
    claims: Mapping[str, model.ResourceClaim],
    templates: Mapping[str, model.ResourceClaimTemplate],
) -> tuple[PodClaim, ...]:
    """The pod's claims in spec order. Pure.

    A `resourceClaimName` entry names the claim. A `resourceClaimTemplateName` entry uses the
    claim recorded in `pod.status.resourceClaimStatuses` (`claim_statuses`: pod claim -> claim
    name, None for "no claim needed", which is left out); while none is recorded, or the
    recorded one is gone, the template's spec stands in under the claim's generateName.
    `claims` are keyed "namespace/name", `templates` by name in the pod's namespace.
    """
    namespace = pod.meta.namespace
    resolved: list[PodClaim] = []
    for index, entry in enumerate(pod.resource_claims):
        where = f"pod {namespace}/{pod.meta.name} spec.resourceClaims[{index}] ({entry.name})"
        if entry.resource_claim_name is not None:
            name = entry.resource_claim_name
            claim = claims.get(f"{namespace}/{name}")
            problem = None if claim is not None else f"ResourceClaim {namespace}/{name} does not exist ({where})"
            resolved.append(PodClaim(pod_claim=entry.name, name=name, claim=claim, problem=problem))
            continue
        if entry.name in claim_statuses and claim_statuses[entry.name] is None:
            continue  # The claim controller recorded that this pod claim needs no ResourceClaim.
        template_name = entry.resource_claim_template_name or ""
        recorded = claim_statuses.get(entry.name)
        existing = claims.get(f"{namespace}/{recorded}") if recorded else None
        if existing is not None:
            resolved.append(
                PodClaim(pod_claim=entry.name, name=existing.meta.name, claim=existing, template=template_name)
            )
            continue
        template = templates.get(template_name)
        generated = podclaims.generate_name(pod.meta.name, entry.name)
        if template is None:
            problem = f"ResourceClaimTemplate {namespace}/{template_name} does not exist ({where})"
            resolved.append(
                PodClaim(
                    pod_claim=entry.name,
                    name=generated,
                    claim=None,
                    created=False,
                    template=template_name,
                    problem=problem,
                )
            )
            continue
        stand_in = model.ResourceClaim(
            meta=model.ObjectMeta(name=generated, namespace=namespace, generate_name=generated), spec=template.spec
        )
        resolved.append(
            PodClaim(pod_claim=entry.name, name=generated, claim=stand_in, created=False, template=template_name)
        )
    return tuple(resolved)


# --- Claims --------------------------------------------------------------------------------


def _allocator(cluster: model.Objects, *, policy: config.Policy, search_limit: int) -> alloc.Allocator:
    """The allocator over the cluster's state, as the scheduler sees it: every allocated claim
    holds its devices (trusted, not re-checked)."""
    snapshot = alloc.Snapshot(
        device_classes=cluster.device_classes,
        resource_slices=cluster.resource_slices,
        nodes=cluster.nodes,
        allocated_claims=tuple(claim for claim in cluster.resource_claims if claim.allocation is not None),
    )
    return alloc.Allocator(snapshot, policy=policy, search_limit=search_limit)


def _requests(
    spec: model.ResourceClaimSpec,
    *,
    allocation: model.AllocationResult | None,
    reasons: Mapping[str, list[str]],
) -> tuple[Request, ...]:
    """Every request and subrequest of `spec` in order, with its devices and reasons."""
    devices: dict[str, list[model.DeviceRequestAllocationResult]] = {}
    for result in allocation.results if allocation is not None else ():
        devices.setdefault(result.request, []).append(result)
    views: list[Request] = []
    for request in spec.requests:
        alternatives: list[tuple[str, model.ExactDeviceRequest | model.DeviceSubRequest, bool]] = []
        if request.exactly is not None:
            alternatives.append((request.name, request.exactly, bool(request.exactly.admin_access)))
        alternatives.extend((f"{request.name}/{sub.name}", sub, False) for sub in request.first_available)
        for name, exact, admin in alternatives:
            views.append(
                Request(
                    name=name,
                    device_class=exact.device_class_name,
                    selectors=exact.selectors,
                    count=None if exact.allocation_mode is model.AllocationMode.ALL else exact.count,
                    admin_access=admin,
                    capacity={key: value.text for key, value in exact.capacity_requests.items()},
                    devices=tuple(devices.get(name, ())),
                    reasons=tuple(reasons.get(name, ())),
                )
            )
    return tuple(views)


def _constraint(constraint: model.DeviceConstraint) -> str:
    """A constraint as the allocator's reasons spell it: "matchAttribute <attr> over <requests>"."""
    if constraint.match_attribute is not None:
        text = f"matchAttribute {constraint.match_attribute}"
    elif constraint.distinct_attribute is not None:
        text = f"distinctAttribute {constraint.distinct_attribute}"
    else:
        text = "(neither matchAttribute nor distinctAttribute)"
    return f"{text} over {', '.join(constraint.requests)}" if constraint.requests else f"{text} over every request"


def _consumer(ref: model.ResourceClaimConsumerReference) -> str:
    group = f"{ref.resource}.{ref.api_group}" if ref.api_group else ref.resource
    return f"{group}/{ref.name}"


def _claim(
    claim: model.ResourceClaim,
    *,
    state: State,
    allocation: model.AllocationResult | None,
    nodes: tuple[str, ...] | None,
    reasons: Sequence[alloc.Reason] = (),
    notes: Sequence[str] = (),
    item: PodClaim | None = None,
) -> Claim:
    """A `Claim` from the model claim, the allocation it holds or would get, and the
    allocator's reasons; a reason for a request the spec does not show becomes claim-level."""
    names = {request.name for request in claim.spec.requests if request.exactly is not None}
    names.update(f"{r.name}/{sub.name}" for r in claim.spec.requests for sub in r.first_available)
    by_request: dict[str, list[str]] = {}
    claim_level: list[str] = []
    for reason in reasons:
        if reason.request is not None and reason.request in names:
            by_request.setdefault(reason.request, []).append(reason.message)
        else:
            claim_level.append(f"{reason.request}: {reason.message}" if reason.request else reason.message)
    return Claim(
        namespace=claim.meta.namespace,
        name=claim.meta.name,
        state=state,
        requests=_requests(claim.spec, allocation=allocation, reasons=by_request),
        constraints=tuple(_constraint(c) for c in claim.spec.constraints),
        nodes=nodes,
        reserved_for=tuple(_consumer(ref) for ref in claim.reserved_for),
        reasons=(*claim_level, *notes),
        created=item.created if item is not None else True,
        template=item.template if item is not None else None,
        pod_claim=item.pod_claim if item is not None else None,
    )


def explain_claim(
    claim: model.ResourceClaim,
    *,
    cluster: model.Objects,
    policy: config.Policy = config.Policy.BINPACK,
    search_limit: int = config.DEFAULT_SEARCH_LIMIT,
) -> Claim:
    """Explain one claim against the cluster's state. Pure (the allocator is private to the call).

    Allocated: where it is and who reserves it. Pending: the allocator tries it on its own on
    any node; it fits (with the node and devices it would get) or does not (with the
    allocator's reasons). A pod's other claims and node constraints are not considered:
    `explain_pod` does that.
    """
    known = placement.known_nodes(cluster)
    if claim.allocation is not None:
        return _claim(
            claim, state=State.ALLOCATED, allocation=claim.allocation, nodes=placement.nodes_of(claim.allocation, known)
        )
    outcome = _allocator(cluster, policy=policy, search_limit=search_limit).allocate([claim])
    if outcome.allocations is not None:
        allocation = outcome.allocations[0]
        nodes = (outcome.node,) if outcome.node is not None else placement.nodes_of(allocation, known)
        return _claim(claim, state=State.FITS, allocation=allocation, nodes=nodes)
    return _claim(claim, state=State.DOES_NOT_FIT, allocation=None, nodes=(), reasons=outcome.reasons)


# --- Pods ----------------------------------------------------------------------------------


def _missing(item: PodClaim, namespace: str) -> Claim:
    return Claim(
        namespace=namespace,
        name=item.name,
        state=State.MISSING,
        reasons=(item.problem or "does not exist",),
        created=item.created,
        template=item.template,
        pod_claim=item.pod_claim,
    )


def _s(items: Sequence[object]) -> str:
    return "" if len(items) == 1 else "s"


def _single(nodes: tuple[str, ...] | None) -> str | None:
    return nodes[0] if nodes is not None and len(nodes) == 1 else None


def explain_pod(
    pod: model.Pod,
    *,
    pod_claims: Sequence[PodClaim],
    cluster: model.Objects,
    policy: config.Policy = config.Policy.BINPACK,
    search_limit: int = config.DEFAULT_SEARCH_LIMIT,
) -> Pod:
    """Explain a pod's claims together, as a scheduler would place the pod. Pure.

    The claims already allocated and the pod's `spec.nodeName` and `spec.nodeSelector` decide
    the nodes the pod may use (`model.placement.candidates`, as `dractl simulate` decides
    them); the pending claims (including those still to be made from templates) are then
    allocated jointly on one of them. What stops the pod before any allocation (a missing
    claim or template, a claim whose `status.reservedFor` is full, no node the pod may use)
    is a pod-level reason, and the pending claims are not tried.
    """
    namespace = pod.meta.namespace
    known = placement.known_nodes(cluster)
    seen: set[str] = set()
    items: list[PodClaim] = []
    for item in pod_claims:
        key = f"{namespace}/{item.name}"
        if key not in seen:  # A pod may name one claim under two entries.
            seen.add(key)
            items.append(item)
    existing = [item for item in items if item.claim is not None]
    allocated = {
        f"{namespace}/{claim.meta.name}": claim.allocation
        for item in existing
        if (claim := item.claim) is not None and claim.allocation is not None
    }
    blockers = [item.problem for item in items if item.problem is not None]
    blockers.extend(
        f"ResourceClaim {namespace}/{claim.meta.name} already has {limits.MAX_RESERVED_FOR} consumers in "
        "status.reservedFor, the most the API allows"
        for item in existing
        if (claim := item.claim) is not None
        and len(claim.reserved_for) >= limits.MAX_RESERVED_FOR
        and all(ref.uid != pod.meta.uid for ref in claim.reserved_for)
    )
    where = placement.candidates(pod, allocated=allocated, cluster=known)
    if where.problem is not None:
        blockers.append(where.problem)
    pending = [item for item in existing if item.claim is not None and item.claim.allocation is None]
    views: dict[str, Claim] = {}
    for item in existing:
        claim = item.claim
        if claim is not None and claim.allocation is not None:
            views[item.name] = _claim(
                claim,
                state=State.ALLOCATED,
                allocation=claim.allocation,
                nodes=placement.nodes_of(claim.allocation, known),
                item=item,
            )
    # A pod without claims has none to place: saying "all claims allocated on node n" would claim a placement.
    state, node = (PodState.ALLOCATED, _single(where.nodes)) if items else (PodState.NO_CLAIMS, None)
    reasons = list(blockers)
    if blockers:
        state = PodState.BLOCKED
        note = "not tried: the pod cannot be scheduled (see the pod's reasons)"
        for item in pending:
            assert item.claim is not None
            views[item.name] = _claim(
                item.claim, state=State.DOES_NOT_FIT, allocation=None, nodes=(), notes=[note], item=item
            )
    elif pending:
        claims = [item.claim for item in pending if item.claim is not None]
        outcome = _allocator(cluster, policy=policy, search_limit=search_limit).allocate(claims, nodes=where.nodes)
        if outcome.allocations is not None:
            state, node = PodState.FITS, outcome.node
            for item, claim, allocation in zip(pending, claims, outcome.allocations, strict=True):
                nodes = (outcome.node,) if outcome.node is not None else placement.nodes_of(allocation, known)
                views[item.name] = _claim(claim, state=State.FITS, allocation=allocation, nodes=nodes, item=item)
        else:
            state, node = PodState.BLOCKED, None
            # Request-level reasons belong to their claim. Reasons without a request are
            # about the whole joint attempt (the allocator files them under the first claim:
            # no node has devices for all requests together, the search limit, a pool no node
            # can use), so they are the pod's.
            own: dict[str, list[alloc.Reason]] = {}
            for reason in outcome.reasons:
                if reason.request is None:
                    reasons.append(reason.message)
                else:
                    own.setdefault(reason.claim, []).append(reason)
            failed = [item.pod_claim for item, claim in zip(pending, claims, strict=True) if claim.key in own]
            scope = "any node the pod may use" if where.nodes is None else "the nodes the pod may use"
            if failed:
                reasons.append(
                    f"its claims must be allocated together on one node, and pod claim{_s(failed)} "
                    f"{', '.join(failed)} cannot be allocated on {scope}"
                )
            joint = (
                f"not allocated: the pod needs all its claims on one node, and pod claim{_s(failed)} "
                f"{', '.join(failed)} cannot be allocated there"
                if failed
                else "not allocated: see the pod's reasons"
            )
            for item, claim in zip(pending, claims, strict=True):
                mine = own.get(claim.key, [])
                views[item.name] = _claim(
                    claim,
                    state=State.DOES_NOT_FIT,
                    allocation=None,
                    nodes=(),
                    reasons=mine,
                    notes=() if mine else [joint],
                    item=item,
                )
    for item in items:
        if item.claim is None:
            views[item.name] = _missing(item, namespace)
    return Pod(
        namespace=namespace,
        name=pod.meta.name,
        state=state,
        node_name=pod.node_name,
        node_selector=dict(pod.node_selector),
        candidates=where.nodes,
        node=node,
        claims=tuple(views[item.name] for item in items),
        reasons=tuple(reasons),
    )


# --- Gangs ---------------------------------------------------------------------------------


def explain_gang(
    pod: model.Pod,
    *,
    group: model.PodGroup | None,
    problem: str | None = None,
    members: Sequence[tuple[model.Pod, Sequence[PodClaim]]] = (),
    cluster: model.Objects,
    policy: config.Policy = config.Policy.BINPACK,
    search_limit: int = config.DEFAULT_SEARCH_LIMIT,
) -> Gang:
    """Explain the PodGroup `pod` joins (`group`, or None with `problem` saying why it cannot be read) with its
    member pods (each with its claims as `resolve_pod_claims` finds them). Pure (the allocator is private to the call).

    A gang whose members are all bound to nodes runs, in the domain of its topology key they share. Otherwise the
    members are placed as one decision (`gang.plan` over the cluster's state, as `dractl simulate` places a gang):
    a bound member stays on its node, a pending one may use the nodes its claims and node constraints allow (its
    claims already allocated count as placed), so that pods joining a gang that runs go to its domain.
    """
    ref = pod.pod_group
    assert ref is not None, "explain_gang is for a pod that joins a PodGroup"
    name = f"{pod.meta.namespace}/{ref.name}"
    names = tuple(member.meta.name for member, _ in members)
    bound = tuple(member.meta.name for member, _ in members if member.node_name)
    if group is None:
        return Gang(name=name, api=ref.api.value, members=names, bound=bound, fits=None, line=problem or "")
    head = gang.describe(group)
    known = placement.known_nodes(cluster)
    if names and len(bound) == len(names) and len(bound) >= (group.min_count or 1):
        key = group.topology_key
        values = {known.labels_of(m.node_name).get(key) for m, _ in members} if key else set()
        where = f" in {key} {values.pop()}" if len(values) == 1 and None not in values else ""
        line = f"{head}: runs, {_count(len(bound), 'member pod')} bound{where}"
        return Gang(name=name, api=ref.api.value, members=names, bound=bound, fits=True, line=line)
    planned = [_member(member, items, cluster=known) for member, items in members]
    allocator = _allocator(cluster, policy=policy, search_limit=search_limit)
    decision = gang.plan(allocator, group, members=planned, cluster=known)
    if decision.reason is not None:
        return Gang(name=name, api=ref.api.value, members=names, bound=bound, fits=False, line=decision.reason)
    label, _, value = (decision.domain or "").partition("=")
    where = f"{label} {value}" if decision.domain else "the cluster"
    line = f"{head}: fits, {len(decision.placed)} of {_count(len(planned), 'member pod')} in {where}"
    left = tuple(member.key.partition("/")[2] for member in decision.left)
    if left:
        line += f"; {', '.join(left)} {'does' if len(left) == 1 else 'do'} not fit there"
    return Gang(name=name, api=ref.api.value, members=names, bound=bound, fits=True, line=line, left=left)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _member(pod: model.Pod, items: Sequence[PodClaim], *, cluster: placement.Cluster) -> gang.Member:
    """One member pod for the gang planner: its pending claims, the nodes it may use, or what stops it."""
    key = f"{pod.meta.namespace}/{pod.meta.name}"
    claims = {f"{pod.meta.namespace}/{item.name}": item.claim for item in items if item.claim is not None}
    allocated = {k: c.allocation for k, c in claims.items() if c.allocation is not None}
    missing = [item.problem for item in items if item.problem is not None]
    where = placement.candidates(pod, allocated=allocated, cluster=cluster)
    problem = "; ".join([*missing, *([where.problem] if where.problem else [])]) or None
    pending = tuple(c for c in claims.values() if c.allocation is None)
    return gang.Member(key=key, claims=pending, nodes=where.nodes, problem=problem)
