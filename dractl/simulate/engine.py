"""The simulation proper: decoded objects in, every claim's allocation or reasons out.

Order, as a cluster would see it: standalone claims (used by no pod) in input order, each on
its own; then pods in input order, each pod's unallocated claims jointly on one node, and
every claim of a placed pod reserved for it. The pods of a PodGroup are placed together, as one
gang (`gang.plan`), where its first member comes: all or nothing, in one domain of its
topology key; a pod whose PodGroup is not in the input stays pending. Claims allocated in the input keep their
devices when their allocation checks out (see `alloc.Allocator.rejected`): the first claim in
input order keeps a device, and a later claim that conflicts with it, or whose allocation
cannot be valid, holds nothing, is reported with status `conflict` or `invalid` and a warning,
and cannot be used by pods. Deterministic for a given input and policy; no I/O.

Opaque configs for dractl's driver that the node agent would refuse (`PrepareCheck`) do not
stop the simulation, as no allocator reads opaque parameters: such a claim is allocated as a
scheduler would allocate it, and carries a warning saying why the node agent will refuse to
prepare it.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping, Sequence

from dractl import alloc, cel, config, gang, model
from dractl.model import opaque, placement
from dractl.simulate import claims

# The API allows at most this many consumers in `status.reservedFor`.


class Status(enum.Enum):
    """What became of a claim; the value is how outputs spell it."""

    ALLOCATED = "allocated"
    NOT_ALLOCATED = "not allocated"
    CONFLICT = "conflict"  # allocated in the input, but an earlier claim holds its device, capacity or counters
    INVALID = "invalid"  # allocated in the input, but a device does not exist or no node can use the allocation


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """One claim as the simulation leaves it. `claim` carries `allocation` and `reservedFor`
    (for `CONFLICT` and `INVALID`, the allocation as the input gave it, holding nothing); it is
    None when the claim cannot exist (its template or the named claim is missing). `reasons`
    say why a claim is not allocated, in conflict or invalid; `warnings` what the node agent
    will refuse when it prepares the claim (`PrepareCheck`), whatever the status."""

    namespace: str
    name: str
    claim: model.ResourceClaim | None
    node: str | None
    reasons: tuple[str, ...]
    status: Status
    warnings: tuple[str, ...] = ()

    @property
    def allocated(self) -> bool:
        return self.status is Status.ALLOCATED


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """Every claim in processing order; `warnings` name each allocation of the input that
    holds nothing, with the claim it conflicts with; `nodes` are the input's known nodes
    (`placement.known_nodes`), by name. Timings: `index_seconds` plans the claims and builds
    the allocator (index, input allocations checked), `allocate_seconds` runs every
    allocation (CEL selectors are evaluated there, on first use); `attempted` counts the claims
    handed to the allocator, allocated or not."""

    claims: tuple[ClaimOutcome, ...]
    attempted: int
    index_seconds: float
    allocate_seconds: float
    warnings: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        """From decoded objects to results: the benchmark's phase."""
        return self.index_seconds + self.allocate_seconds

    @property
    def claims_per_second(self) -> float:
        """`attempted` over `seconds` (index and allocate), as the benchmark reports it."""
        return self.attempted / self.seconds if self.seconds > 0 else 0.0

    @property
    def allocate_claims_per_second(self) -> float:
        """`attempted` over `allocate_seconds` alone."""
        return self.attempted / self.allocate_seconds if self.allocate_seconds > 0 else 0.0


def _reason_text(reason: alloc.Reason) -> str:
    return f"{reason.request}: {reason.message}" if reason.request else reason.message


class PrepareCheck:
    """What the node agent of dractl's driver will refuse when it prepares a claim: its opaque
    configs (`opaque`), one warning line each, naming the claim and the field.

    An allocated claim is checked as the agent checks it (`opaque.select` over the allocation's
    configs, the class's and the claim's, and the kind of each device of the driver: a config
    that names a request of a MIG device must be a MigDeviceConfig), in the agent's own words;
    any other claim by its own configs, as the chart's admission policy words it. A device's
    kind is its `type` attribute (`gpu` or `mig`, as the NVIDIA driver and dractl's agent
    publish it); devices without one are not judged by kind. Pure; the devices' kinds are read
    from the slices once, on the first claim that needs them.
    """

    def __init__(self, slices: Sequence[model.ResourceSlice], *, driver: str = config.DEFAULT_DRIVER_NAME) -> None:
        self._slices = slices
        self._driver = driver
        self._kinds: dict[tuple[str, str], opaque.DeviceKind] | None = None

    def warnings(self, claim: model.ResourceClaim | None, *, allocated: bool) -> tuple[str, ...]:
        """The warnings for `claim`; `allocated` says its allocation holds its devices (else only
        its own configs are checked)."""
        if claim is None:
            return ()
        where = f"the node agent will refuse to prepare it: claim {claim.meta.namespace}/{claim.meta.name}"
        allocation = claim.allocation
        if not allocated or allocation is None:
            found = opaque.config_problems(
                [c.opaque for c in claim.spec.config], path="spec.devices.config", driver=self._driver
            )
            return tuple(f"{where}: {problem}" for problem in found)
        ours = [r for r in allocation.results if r.driver == self._driver]
        if not ours or not any(c.opaque.driver == self._driver for c in allocation.config):
            return ()  # the agent prepares only claims with its devices, and has nothing to refuse without a config
        kinds = self._device_kinds()
        results = [(r.request, kind) for r in ours if (kind := kinds.get((r.pool, r.device))) is not None]
        try:
            opaque.select(allocation.config, driver=self._driver, results=results)
        except opaque.ConfigError as err:
            return (f"{where}: {opaque.message(err, allocation.config)}",)
        return ()

    def _device_kinds(self) -> dict[tuple[str, str], opaque.DeviceKind]:
        if self._kinds is None:
            self._kinds = {}
            qualified = f"{self._driver}/type"
            for s in self._slices:
                if s.driver != self._driver:
                    continue
                for device in s.devices:
                    value = device.attributes.get("type") or device.attributes.get(qualified)
                    kind = _KINDS.get(str(value.scalar)) if value is not None and not value.is_list else None
                    if kind is not None:
                        self._kinds[(s.pool.name, device.name)] = kind
        return self._kinds


# A device's `type` attribute -> the config kind the node agent wants for it.
_KINDS = {"gpu": opaque.DeviceKind.GPU, "mig": opaque.DeviceKind.MIG}


class _Ledger:
    """The claims seen so far, keyed by "namespace/name" in first-seen order, with the node
    each one landed on and the reasons of the last attempt that failed."""

    def __init__(self, cluster: placement.Cluster) -> None:
        self.cluster = cluster
        self.attempted = 0
        self.rejected: Mapping[str, tuple[alloc.Rejection, ...]] = {}
        self._names: dict[str, tuple[str, str]] = {}
        self._claims: dict[str, model.ResourceClaim | None] = {}
        self._nodes: dict[str, str | None] = {}
        self._reasons: dict[str, list[str]] = {}

    def add(self, *, key: str, namespace: str, name: str, claim: model.ResourceClaim | None) -> None:
        if key in self._names:
            return
        self._names[key] = (namespace, name)
        self._claims[key] = claim
        self._reasons[key] = []
        node = None
        rejections = self.rejected.get(key)
        if rejections:
            self._reasons[key] = [r.message for r in rejections]
        elif claim is not None and claim.allocation is not None:
            # A claim allocated in the input is shown on its node when its selector names one.
            usable = placement.nodes_of(claim.allocation, self.cluster)
            node = usable[0] if usable is not None and len(usable) == 1 else None
        self._nodes[key] = node

    def holds(self, key: str) -> bool:
        """Whether the claim's allocation holds its devices (False for unallocated, conflicting
        and invalid claims)."""
        claim = self._claims[key]
        return claim is not None and claim.allocation is not None and key not in self.rejected

    def status(self, key: str) -> Status:
        rejections = self.rejected.get(key)
        if rejections:
            return Status.CONFLICT if any(r.kind == alloc.CONFLICT for r in rejections) else Status.INVALID
        return Status.ALLOCATED if self.holds(key) else Status.NOT_ALLOCATED

    def claim(self, key: str) -> model.ResourceClaim | None:
        return self._claims[key]

    def fail(self, keys: Sequence[str], *reasons: str) -> None:
        for key in keys:
            self._reasons[key] = list(reasons)

    def note(self, key: str, reason: str) -> None:
        self._reasons[key].append(reason)

    def allocate(
        self,
        allocator: alloc.Allocator,
        pending: Sequence[model.ResourceClaim],
        *,
        nodes: tuple[str, ...] | None,
        context: str,
    ) -> bool:
        """Allocate `pending` jointly; record the allocations or every claim's reasons."""
        self.attempted += len(pending)
        outcome = allocator.allocate(pending, nodes=nodes)
        if outcome.allocations is not None:
            for claim, allocation in zip(pending, outcome.allocations, strict=True):
                self.record(claim, allocation, node=outcome.node)
            return True
        by_claim: dict[str, list[str]] = {}
        for reason in outcome.reasons:
            by_claim.setdefault(reason.claim, []).append(_reason_text(reason))
        keys = {claim.key for claim in pending}
        failed = ", ".join(key for key in by_claim if key in keys)
        joint = f"not allocated: {context} needs all its claims on one node, and {failed} could not be allocated there"
        for claim in pending:
            self._reasons[claim.key] = by_claim.get(claim.key) or [joint if failed else "not allocated"]
        return False

    def record(self, claim: model.ResourceClaim, allocation: model.AllocationResult, *, node: str | None) -> None:
        """Record the allocation the allocator made (and holds) for `claim`, on `node`."""
        key = claim.key  # a property that formats the key on every use
        # Built directly: dataclasses.replace inspects the fields on every call.
        self._claims[key] = model.ResourceClaim(
            meta=claim.meta,
            spec=claim.spec,
            allocation=allocation,
            reserved_for=claim.reserved_for,
            source=claim.source,
        )
        self._nodes[key] = node
        self._reasons[key] = []

    def reserve(self, key: str, consumer: model.ResourceClaimConsumerReference) -> None:
        claim = self._claims[key]
        if claim is not None and all(ref.uid != consumer.uid for ref in claim.reserved_for):
            self._claims[key] = dataclasses.replace(claim, reserved_for=(*claim.reserved_for, consumer))

    def outcomes(self, check: PrepareCheck) -> tuple[ClaimOutcome, ...]:
        return tuple(
            ClaimOutcome(
                namespace=ns,
                name=name,
                claim=self._claims[key],
                node=self._nodes[key],
                reasons=tuple(self._reasons[key]),
                status=self.status(key),
                warnings=check.warnings(self._claims[key], allocated=self.holds(key)),
            )
            for key, (ns, name) in self._names.items()
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Ready:
    """A pod's claims entered in the ledger: those it uses (by key), those still to allocate, the keys of its
    PodGroup's claims among them, and the nodes it may use (None: any); or why it cannot be scheduled."""

    existing: Mapping[str, model.ResourceClaim]
    pending: tuple[model.ResourceClaim, ...]
    group_claims: frozenset[str]
    nodes: tuple[str, ...] | None
    problem: str | None


def _ready(work: claims.PodWork, *, ledger: _Ledger) -> _Ready:
    """Enter the pod's claims in the ledger and say where it may go, or why it cannot be scheduled."""
    items = claims.distinct(work.claims)
    context = f"pod {work.key}"
    for item in items:
        ledger.add(key=item.key, namespace=item.namespace, name=item.name, claim=item.claim)
    existing = {item.key: claim for item in items if (claim := ledger.claim(item.key)) is not None}
    pending = tuple(claim for claim in existing.values() if claim.allocation is None)
    group_claims = frozenset(item.key for item in items if item.pod_group is not None)
    problems = [(item.key, item.problem) for item in items if item.problem is not None]
    for key, problem in problems:
        ledger.note(key, problem)

    def refused(problem: str) -> _Ready:
        return _Ready(existing=existing, pending=pending, group_claims=group_claims, nodes=(), problem=problem)

    # A claim whose input allocation holds nothing cannot be used, as a pod cannot run with it.
    problems.extend(
        (key, f"ResourceClaim {key} is in {ledger.status(key).value} status: its status.allocation holds no devices")
        for key in existing
        if key in ledger.rejected
    )
    if problems:
        return refused(f"{context} cannot be scheduled: {'; '.join(problem for _, problem in problems)}")
    full = [
        key
        for key, claim in existing.items()
        if len(claim.reserved_for) >= model.limits.MAX_RESERVED_FOR
        and all(ref.uid != work.uid for ref in claim.reserved_for)
    ]
    if full:
        return refused(
            f"{', '.join(full)} already has {model.limits.MAX_RESERVED_FOR} consumers in "
            "status.reservedFor, the most the API allows"
        )
    allocated = {key: c.allocation for key, c in existing.items() if c.allocation is not None and ledger.holds(key)}
    where = placement.candidates(work.pod, allocated=allocated, cluster=ledger.cluster)
    if where.problem is not None:
        return refused(where.problem)
    return _Ready(existing=existing, pending=pending, group_claims=group_claims, nodes=where.nodes, problem=None)


def _place_pod(work: claims.PodWork, *, allocator: alloc.Allocator, ledger: _Ledger) -> None:
    """Allocate the pod's unallocated claims on one node and reserve all its claims for it."""
    ready = _ready(work, ledger=ledger)
    if ready.problem is not None:
        ledger.fail([claim.key for claim in ready.pending], f"not allocated: {ready.problem}")
        return
    context = f"pod {work.key}"
    if ready.pending and not ledger.allocate(allocator, ready.pending, nodes=ready.nodes, context=context):
        return
    consumer = model.ResourceClaimConsumerReference(resource="pods", name=work.pod.meta.name, uid=work.uid)
    for key in ready.existing:
        ledger.reserve(key, consumer)


def _place_gang(
    group: model.PodGroup,
    works: Sequence[claims.PodWork],
    *,
    allocator: alloc.Allocator,
    ledger: _Ledger,
    levels: Sequence[str],
) -> None:
    """Place the PodGroup's member pods as one gang (`gang.plan`): the placed members' claims allocated and
    reserved for them (the group's own claims for the group), every claim of the others reporting why."""
    readies = [_ready(work, ledger=ledger) for work in works]
    members = [
        gang.Member(key=work.key, claims=ready.pending, nodes=ready.nodes, problem=ready.problem)
        for work, ready in zip(works, readies, strict=True)
    ]
    ledger.attempted += len({claim.key for ready in readies for claim in ready.pending})
    decision = gang.plan(allocator, group, members=members, cluster=ledger.cluster, levels=levels)
    placed = {member.key: member for member in decision.placed}
    group_consumer = model.ResourceClaimConsumerReference(
        resource="podgroups",
        name=group.meta.name,
        uid=claims.group_uid(group),
        api_group=group.api.value.partition("/")[0],
    )
    for work, ready in zip(works, readies, strict=True):
        member = placed.get(work.key)
        if member is None:
            continue
        for claim, allocation in member.allocations:
            ledger.record(claim, allocation, node=member.node)
        consumer = model.ResourceClaimConsumerReference(resource="pods", name=work.pod.meta.name, uid=work.uid)
        for key in ready.existing:
            ledger.reserve(key, group_consumer if key in ready.group_claims else consumer)
    # After every placed member: a claim shared with one of them holds its allocation, not this member's reasons.
    by_key = {work.key: ready for work, ready in zip(works, readies, strict=True)}
    for left in decision.left:
        ready = by_key[left.key]
        ledger.fail([claim.key for claim in ready.pending if not ledger.holds(claim.key)], *left.reasons)


def _hold_back(work: claims.PodWork, *, ledger: _Ledger) -> None:
    """A pod whose PodGroup is not in the input: pending, as a scheduler holds it until the group exists."""
    ready = _ready(work, ledger=ledger)
    ref = work.pod.pod_group
    assert ref is not None
    ledger.fail(
        [claim.key for claim in ready.pending],
        f"not allocated: pod {work.key} joins PodGroup {work.pod.meta.namespace}/{ref.name} ({ref.api.value}), "
        "which is not in the input: a scheduler keeps the pod pending until its PodGroup exists",
    )


def refused(objects: model.Objects) -> tuple[str, ...]:
    """What the API server refuses in `objects`, one line each naming the file, object and field: selectors that
    do not compile (`cel.problems`). Pure."""
    return cel.problems(objects)


def unpreparable(objects: model.Objects) -> tuple[str, ...]:
    """The opaque configs for dractl's driver in `objects` that the node agent would refuse at prepare time, one
    warning line each naming the file, object and field, as the chart's admission policy refuses them at apply time
    (`opaque.problems`). A warning, not a refusal: a dump of a live cluster holds them where the policy was off (its
    failure policy is Ignore), and a claim that has one is allocated all the same (`PrepareCheck` marks it). Pure."""
    return tuple(
        f"{problem} (the node agent will refuse to prepare a claim with this config)"
        for problem in opaque.problems(objects, driver=config.DEFAULT_DRIVER_NAME)
    )


def simulate(
    objects: model.Objects, *, policy: alloc.Policy, search_limit: int, topology_levels: Sequence[str] = ()
) -> Result:
    """Run the whole simulation over decoded objects. Deterministic; no I/O.

    `topology_levels` are node label keys, from the widest to the narrowest, whose smallest domain
    that holds a whole gang is preferred (`gang.plan`).

    Two timed phases (wall time): index, from planning the claims through building the
    allocator (which checks the input's allocations), and allocate, through the last
    allocation.
    """
    start = time.perf_counter()
    ledger = _Ledger(placement.known_nodes(objects))
    plan = claims.plan(objects)
    snapshot = alloc.Snapshot(
        device_classes=objects.device_classes,
        resource_slices=objects.resource_slices,
        nodes=objects.nodes,
        allocated_claims=tuple(claim for claim in objects.resource_claims if claim.allocation is not None),
        # The input is what a user wrote, not the API's state: a later claim on a held device is refused.
        check_allocated=True,
    )
    allocator = alloc.Allocator(snapshot, policy=policy, search_limit=search_limit)
    ledger.rejected = allocator.rejected
    indexed = time.perf_counter()
    for claim in plan.standalone:
        key = claim.key
        ledger.add(key=key, namespace=claim.meta.namespace, name=claim.meta.name, claim=claim)
        if claim.allocation is None:
            ledger.allocate(allocator, [claim], nodes=None, context=f"claim {key}")
    # By API too: the two APIs' PodGroups are different resources, and a pod joins through one.
    groups = {(group.key, group.api): group for group in objects.pod_groups}
    gangs: dict[tuple[str, model.PodGroupApi], list[claims.PodWork]] = {}
    for work in plan.pods:
        ref = work.pod.pod_group
        if ref is not None:
            gangs.setdefault((f"{work.pod.meta.namespace}/{ref.name}", ref.api), []).append(work)
    for work in plan.pods:
        ref = work.pod.pod_group
        if ref is None:
            _place_pod(work, allocator=allocator, ledger=ledger)
            continue
        joined = (f"{work.pod.meta.namespace}/{ref.name}", ref.api)
        group = groups.get(joined)
        if group is None:
            _hold_back(work, ledger=ledger)
            continue
        works = gangs.pop(joined, None)
        if works is not None:
            _place_gang(group, works, allocator=allocator, ledger=ledger, levels=topology_levels)
    outcomes = ledger.outcomes(PrepareCheck(objects.resource_slices))
    done = time.perf_counter()
    warnings = tuple(r.message for rejections in allocator.rejected.values() for r in rejections)
    return Result(
        claims=outcomes,
        attempted=ledger.attempted,
        index_seconds=indexed - start,
        allocate_seconds=done - indexed,
        warnings=warnings,
        nodes=ledger.cluster.names,
    )
