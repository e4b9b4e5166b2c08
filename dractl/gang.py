"""Gang placement: every pod of a PodGroup placed as one decision, inside one topology domain.

What it does: given the allocator, a group and its member pods (their unallocated claims and the
nodes each may use), finds the domain of the group's required node label (all nodes when it has
none) where at least `minCount` members get a node and their claims, preferring the smallest
domain of the preferred levels (`levels`, node label keys from the widest to the narrowest) that
holds every member, so that larger domains stay whole for larger gangs. All or nothing: when no
domain holds `minCount` members, every tentative allocation is released and one line says why,
with the best domain and what it lacks. Shared by `simulate`, `explain` and the scheduler, hence a
layer of its own above the allocator. What it must not do: see an API object, do I/O, or decide
node fit beyond the nodes it is given and the claims' allocations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from dractl import alloc, model
from dractl.model import placement

HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The node label the kubelet sets to the node's name; a node without it is its own value."""


class Allocator(Protocol):
    """What a gang's placement asks of the allocator (`alloc.Allocator`, or the scheduler's long-lived one)."""

    def allocate(self, claims: Sequence[model.ResourceClaim], *, nodes: Sequence[str] | None = None) -> alloc.Outcome:
        """Allocate `claims` together on one of `nodes`; on success each claim holds its devices."""
        ...

    def release(self, claim_id: str) -> bool:
        """Give back what the claim holds; False when it held nothing."""
        ...

    def consider(self, claims: Sequence[model.ResourceClaim]) -> None:
        """Make the request shapes of pending claims known, without allocating."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """One pod of a gang: its "namespace/name", the claims to allocate for it (unallocated, without
    repeats, shared ones included: a claim two members use is allocated once, with the first), the
    nodes it may use (None: any) and, when it cannot be placed at all, why."""

    key: str
    claims: tuple[model.ResourceClaim, ...] = ()
    nodes: tuple[str, ...] | None = None
    problem: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    """A member with a place: its node (None when no claim pins one) and the claims allocated for it."""

    key: str
    node: str | None
    allocations: tuple[tuple[model.ResourceClaim, model.AllocationResult], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Left:
    """A member without a place in the chosen (or best) domain, and why."""

    key: str
    reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one gang. On success `placed` holds at least `minCount` members (their
    allocations held by the allocator), `left` the members that did not fit, and `domain` the chosen
    domain as `label=value` (None: the whole cluster); `reason` is None. On failure `placed` is empty,
    the allocator holds nothing of the gang, `left` holds every member with its reasons in the best
    domain, and `reason` is the gang's one line."""

    placed: tuple[Placed, ...]
    left: tuple[Left, ...]
    domain: str | None
    reason: str | None

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclasses.dataclass(frozen=True, slots=True)
class _Domain:
    """Nodes that share `value` of the node label `label`; `label` "" is the whole cluster."""

    label: str
    value: str
    nodes: tuple[str, ...]

    @property
    def name(self) -> str | None:
        return f"{self.label}={self.value}" if self.label else None


@dataclasses.dataclass(frozen=True, slots=True)
class _Attempt:
    domain: _Domain
    placed: tuple[Placed, ...]
    left: tuple[tuple[Member, tuple[str, ...]], ...]


def plan(
    allocator: Allocator,
    group: model.PodGroup,
    *,
    members: Sequence[Member],
    cluster: placement.Cluster,
    levels: Sequence[str] = (),
) -> Plan:
    """Place the gang all or nothing. Deterministic for a given allocator state and input (domains
    are tried smallest first, ties by label value; members in the given order). On success the
    allocator holds the placed members' allocations; on failure it holds exactly what it held
    before. Pure apart from the allocator's holdings."""
    need = group.min_count or 1
    head = describe(group)
    if len(members) < need:
        count = f"{len(members)} member pod{'' if len(members) == 1 else 's'}"
        return _failed(members, f"{head}: {count}, fewer than its minCount")
    # The shapes of every member known up front: the allocator's choices then depend on the gang, not on the order
    # in which its attempts happen to meet the shapes, so an attempt made again chooses the same.
    allocator.consider([claim for member in members for claim in member.claims])
    key = group.topology_key
    required = _domains(cluster, cluster.names, key) if key else [_Domain("", "", cluster.names)]
    if not required:
        return _failed(members, f"{head}: no node has the label {key}")
    tried: set[tuple[str, ...]] = set()
    for level in reversed(levels):
        narrower = sorted(
            (sub for domain in required for sub in _domains(cluster, domain.nodes, level)),
            key=lambda d: (len(d.nodes), d.value),
        )
        for domain in narrower:
            if domain.nodes in tried:
                continue
            tried.add(domain.nodes)
            attempt = _attempt(allocator, members, domain=domain, cluster=cluster, whole=True)
            if not attempt.left:
                return _success(attempt)
            _release(allocator, attempt)
    best: _Attempt | None = None
    for domain in sorted(required, key=lambda d: (len(d.nodes), d.value)):
        beat = -1 if best is None else len(best.placed)
        attempt = _attempt(allocator, members, domain=domain, cluster=cluster, whole=False, beat=beat)
        if not attempt.left:
            return _success(attempt)
        _release(allocator, attempt)
        if best is None or len(attempt.placed) > len(best.placed):
            best = attempt
    assert best is not None  # `required` is not empty
    if len(best.placed) >= need:
        again = _attempt(allocator, members, domain=best.domain, cluster=cluster, whole=False)
        if len(again.placed) >= need:
            return _success(again)
        _release(allocator, again)
    return _failed_in(best, members, head=head, need=need, key=key)


def describe(group: model.PodGroup) -> str:
    """How the gang's lines begin: `gang ml/train (minCount 8, topology rack)`. Pure."""
    facts = [f"minCount {group.min_count}"] if group.min_count is not None else []
    if group.topology_key:
        facts.append(f"topology {group.topology_key}")
    what = "gang" if group.min_count is not None else "pod group"
    return f"{what} {group.key}" + (f" ({', '.join(facts)})" if facts else "")


def domain_nodes(cluster: placement.Cluster, domain: str | None) -> tuple[str, ...]:
    """The nodes of a `Plan.domain` (`label=value`; None: every node), so that pods joining a gang that runs go
    where it runs. Pure."""
    if domain is None:
        return cluster.names
    label, _, value = domain.partition("=")
    return next((d.nodes for d in _domains(cluster, cluster.names, label) if d.value == value), ())


def running_domains(
    cluster: placement.Cluster, nodes: Iterable[str], *, key: str | None, levels: Sequence[str] = ()
) -> tuple[str | None, ...]:
    """Where pods joining a gang that runs on `nodes` may go, most preferred first (each as `Plan.domain`:
    `label=value`, None for the whole cluster): the domains of `levels`, narrowest first, that hold every one of those
    nodes, then the domain of the gang's required `key` (the whole cluster when it has none), which the joiners never
    leave. Empty when the nodes are not in one domain of `key`. Pure."""
    on = tuple(nodes)
    required: str | None = None
    if key:
        values = {_value(cluster, node, key) for node in on}
        if len(values) != 1 or None in values:
            return ()  # Not in one domain of its key (placed by someone else): no place keeps the gang together.
        required = f"{key}={values.pop()}"
    preferred: list[str | None] = []
    for label in reversed(levels):
        values = {_value(cluster, node, label) for node in on}
        if len(values) == 1 and None not in values:
            preferred.append(f"{label}={values.pop()}")
    ordered = list(dict.fromkeys(preferred))
    if required not in ordered:
        ordered.append(required)
    return tuple(ordered)


def _value(cluster: placement.Cluster, node: str, label: str) -> str | None:
    """The node's value of `label`; a node without the hostname label is its own value."""
    value = cluster.labels_of(node).get(label)
    return node if value is None and label == HOSTNAME_LABEL else value


def _domains(cluster: placement.Cluster, nodes: Iterable[str], label: str) -> list[_Domain]:
    """The domains of `label` among `nodes`, by value; nodes without the label belong to none."""
    by_value: dict[str, list[str]] = {}
    for node in nodes:
        value = _value(cluster, node, label)
        if value is not None:
            by_value.setdefault(value, []).append(node)
    return [_Domain(label, value, tuple(names)) for value, names in sorted(by_value.items())]


_Failure = tuple[tuple[int, str | None, str], ...]
"""Why a member did not fit, each reason as (index of its claim among those tried, request, message)."""


def _attempt(
    allocator: Allocator,
    members: Sequence[Member],
    *,
    domain: _Domain,
    cluster: placement.Cluster,
    whole: bool,
    beat: int = -1,
) -> _Attempt:
    """Place the members in `domain` in order; the allocator holds what was placed until `_release`.
    With `whole`, stop at the first member that does not fit (only a placement of every member is wanted);
    otherwise stop once the attempt can no longer place more than `beat` members (it would not be the best).

    Members of one shape (the same claim specs and allowed nodes, as a Job's pods are) that follow one that did
    not fit are not tried again: within an attempt the allocator only gives out more, so they would not fit
    either. That bounds an attempt by the shapes, not the pods, of a large gang."""
    placed: list[Placed] = []
    left: list[tuple[Member, tuple[str, ...]]] = []
    tentative: dict[str, model.AllocationResult] = {}
    failed: dict[tuple[int, ...], _Failure] = {}
    for index, member in enumerate(members):
        reasons = _place(
            allocator, member, domain=domain, cluster=cluster, tentative=tentative, placed=placed, failed=failed
        )
        if not reasons:
            continue
        left.append((member, reasons))
        rest = members[index + 1 :]
        if whole or len(placed) + len(rest) <= beat:
            left.extend((later, ("not tried",)) for later in rest)
            break
    return _Attempt(domain=domain, placed=tuple(placed), left=tuple(left))


def _place(
    allocator: Allocator,
    member: Member,
    *,
    domain: _Domain,
    cluster: placement.Cluster,
    tentative: dict[str, model.AllocationResult],
    placed: list[Placed],
    failed: dict[tuple[int, ...], _Failure],
) -> tuple[str, ...]:
    """Place one member (appended to `placed`, its allocations to `tentative`); the reasons it does not fit,
    empty when placed. `failed` holds the failures of this attempt by shape (`_attempt`)."""
    if member.problem is not None:
        return (member.problem,)
    nodes: tuple[str, ...] | None = domain.nodes if domain.label else None
    if member.nodes is not None:
        allowed = set(member.nodes)
        nodes = tuple(n for n in (nodes if nodes is not None else member.nodes) if n in allowed)
    pending = []
    pinned = False
    for claim in member.claims:
        allocation = tentative.get(claim.key)
        if allocation is None:
            pending.append(claim)
            continue
        # A claim an earlier member got in this attempt pins this one to where it is usable.
        usable = placement.nodes_of(allocation, cluster)
        if usable is not None:
            pinned = True
            within = set(usable)
            nodes = tuple(n for n in (nodes if nodes is not None else usable) if n in within)
    if nodes is not None and not nodes:
        where = f"{domain.label} {domain.value}" if domain.label else "the cluster"
        return (f"no node of {where} is one pod {member.key} may use",)
    if not pending:
        placed.append(Placed(key=member.key, node=nodes[0] if nodes and len(nodes) == 1 else None, allocations=()))
        return ()
    # The objects identify the shape: a Job's claims share their template's spec, and every
    # member's nodes are computed once by the caller. Alive for the whole attempt, so ids are not reused.
    shape = None if pinned else (id(member.nodes), *(id(claim.spec) for claim in pending))
    failure = failed.get(shape) if shape is not None else None
    if failure is None:
        outcome = allocator.allocate(pending, nodes=nodes)
        if outcome.allocations is not None:
            for claim, allocation in zip(pending, outcome.allocations, strict=True):
                tentative[claim.key] = allocation
            allocations = tuple(zip(pending, outcome.allocations, strict=True))
            placed.append(Placed(key=member.key, node=outcome.node, allocations=allocations))
            return ()
        index = {claim.key: i for i, claim in enumerate(pending)}
        failure = tuple((index.get(r.claim, 0), r.request, r.message) for r in outcome.reasons)
        if shape is not None:
            failed[shape] = failure
    reasons = tuple(
        f"{pending[i].key}: {request}: {message}" if request else f"{pending[i].key}: {message}"
        for i, request, message in failure
    )
    return reasons or ("not allocated",)


def _release(allocator: Allocator, attempt: _Attempt) -> None:
    for member in attempt.placed:
        for claim, _ in member.allocations:
            allocator.release(alloc.claim_id(claim))


def _success(attempt: _Attempt) -> Plan:
    left = tuple(Left(key=member.key, reasons=reasons) for member, reasons in attempt.left)
    return Plan(placed=attempt.placed, left=left, domain=attempt.domain.name, reason=None)


def _failed(members: Sequence[Member], reason: str) -> Plan:
    return Plan(placed=(), left=tuple(Left(key=m.key, reasons=(reason,)) for m in members), domain=None, reason=reason)


def _failed_in(best: _Attempt, members: Sequence[Member], *, head: str, need: int, key: str | None) -> Plan:
    fits = len(best.placed)
    short = need - fits
    # What the gang lacks: the devices of the members that did not fit, the least demanding first, as many as
    # the gang is short of.
    lacking = sorted((member for member, _ in best.left), key=lambda m: sum(_devices(m.claims).values()))[:short]
    devices: dict[str, int] = {}
    for member in lacking:
        for class_name, count in _devices(member.claims).items():
            devices[class_name] = devices.get(class_name, 0) + count
    missing = "".join(f", {count} {_noun(name, count)} of class {name}" for name, count in sorted(devices.items()))
    pods = f"{short} pod{'' if short == 1 else 's'} short{missing}"
    if key:
        reason = f"{head}: no {key} fits {need} pods; best {best.domain.value} fits {fits}: {pods}"
    else:
        reason = f"{head}: the cluster fits {fits} of {need} pods: {pods}"
    own = {member.key: reasons for member, reasons in best.left}
    left = tuple(Left(key=member.key, reasons=(reason, *own.get(member.key, ()))) for member in members)
    return Plan(placed=(), left=left, domain=None, reason=reason)


def _devices(claims: Sequence[model.ResourceClaim]) -> Mapping[str, int]:
    """Devices the claims ask for, by class: an exact count, or a `firstAvailable` request's first choice
    (an `All` request's count is the inventory's, unknown here, and not counted)."""
    devices: dict[str, int] = {}
    for claim in claims:
        for request in claim.spec.requests:
            first = request.exactly or (request.first_available[0] if request.first_available else None)
            if first is not None and first.allocation_mode is model.AllocationMode.EXACT_COUNT:
                devices[first.device_class_name] = devices.get(first.device_class_name, 0) + first.count
    return devices


def _noun(class_name: str, count: int) -> str:
    noun = "GPU" if "gpu" in class_name.lower() else "device"
    return noun if count == 1 else noun + "s"
