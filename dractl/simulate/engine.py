"""The simulation proper: decoded objects in, every claim's allocation or reasons out.

Order, as a cluster would see it: standalone claims (used by no pod) in input order, each on
its own; then pods in input order, each pod's unallocated claims jointly on one node, and
every claim of a placed pod reserved for it. Claims allocated in the input keep their
devices. Deterministic for a given input and policy; no I/O.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from dractl import alloc, model
from dractl.simulate import claims, placement

# The API allows at most this many consumers in `status.reservedFor`.
_MAX_RESERVED_FOR = 256


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """One claim as the simulation leaves it. `claim` carries `allocation` and `reservedFor`;
    it is None when the claim cannot exist (its template or the named claim is missing)."""

    namespace: str
    name: str
    claim: model.ResourceClaim | None
    node: str | None
    reasons: tuple[str, ...]

    @property
    def allocated(self) -> bool:
        return self.claim is not None and self.claim.allocation is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """Every claim in processing order, and how long the allocation phase took for how many
    claims (those handed to the allocator, allocated or not)."""

    claims: tuple[ClaimOutcome, ...]
    attempted: int
    seconds: float

    @property
    def claims_per_second(self) -> float:
        return self.attempted / self.seconds if self.seconds > 0 else 0.0


def _reason_text(reason: alloc.Reason) -> str:
    return f"{reason.request}: {reason.message}" if reason.request else reason.message


class _Ledger:
    """The claims seen so far, keyed by "namespace/name" in first-seen order, with the node
    each one landed on and the reasons of the last attempt that failed."""

    def __init__(self, cluster: placement.Cluster) -> None:
        self.cluster = cluster
        self.attempted = 0
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
        if claim is not None and claim.allocation is not None:
            # A claim allocated in the input is shown on its node when its selector names one.
            usable = placement.nodes_of(claim.allocation, self.cluster)
            node = usable[0] if usable is not None and len(usable) == 1 else None
        self._nodes[key] = node

    def claim(self, key: str) -> model.ResourceClaim | None:
        return self._claims[key]

    def fail(self, keys: Sequence[str], reason: str) -> None:
        for key in keys:
            self._reasons[key] = [reason]

    def note(self, key: str, reason: str) -> None:
        self._reasons[key].append(reason)

    def allocate(self, allocator: alloc.Allocator, pending: Sequence[model.ResourceClaim], *, nodes: tuple[str, ...] | None, context: str) -> bool:
        """Allocate `pending` jointly; record the allocations or every claim's reasons."""
        self.attempted += len(pending)
        outcome = allocator.allocate(pending, nodes=nodes)
        if outcome.allocations is not None:
            for claim, allocation in zip(pending, outcome.allocations, strict=True):
                self._claims[claim.key] = dataclasses.replace(claim, allocation=allocation)
                self._nodes[claim.key] = outcome.node
                self._reasons[claim.key] = []
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

    def reserve(self, key: str, consumer: model.ResourceClaimConsumerReference) -> None:
        claim = self._claims[key]
        if claim is not None and all(ref.uid != consumer.uid for ref in claim.reserved_for):
            self._claims[key] = dataclasses.replace(claim, reserved_for=(*claim.reserved_for, consumer))

    def outcomes(self) -> tuple[ClaimOutcome, ...]:
        return tuple(
            ClaimOutcome(namespace=ns, name=name, claim=self._claims[key], node=self._nodes[key], reasons=tuple(self._reasons[key]))
            for key, (ns, name) in self._names.items()
        )


def _place_pod(work: claims.PodWork, *, allocator: alloc.Allocator, ledger: _Ledger) -> None:
    """Allocate the pod's unallocated claims on one node and reserve all its claims for it."""
    items = claims.distinct(work.claims)
    context = f"pod {work.key}"
    for item in items:
        ledger.add(key=item.key, namespace=item.namespace, name=item.name, claim=item.claim)
    existing = {item.key: claim for item in items if (claim := ledger.claim(item.key)) is not None}
    pending = [claim for claim in existing.values() if claim.allocation is None]
    problems = [(item.key, item.problem) for item in items if item.problem is not None]
    for key, problem in problems:
        ledger.note(key, problem)
    if problems:
        why = "; ".join(problem for _, problem in problems)
        ledger.fail([claim.key for claim in pending], f"not allocated: {context} cannot be scheduled: {why}")
        return
    full = [
        key
        for key, claim in existing.items()
        if len(claim.reserved_for) >= _MAX_RESERVED_FOR and all(ref.uid != work.uid for ref in claim.reserved_for)
    ]
    if full:
        ledger.fail([claim.key for claim in pending], f"not allocated: {', '.join(full)} already has {_MAX_RESERVED_FOR} consumers in status.reservedFor, the most the API allows")
        return
    allocated = {key: claim.allocation for key, claim in existing.items() if claim.allocation is not None}
    where = placement.candidates(work.pod, allocated=allocated, cluster=ledger.cluster)
    if where.problem is not None:
        ledger.fail([claim.key for claim in pending], f"not allocated: {where.problem}")
        return
    if pending and not ledger.allocate(allocator, pending, nodes=where.nodes, context=context):
        return
    consumer = model.ResourceClaimConsumerReference(resource="pods", name=work.pod.meta.name, uid=work.uid)
    for key in existing:
        ledger.reserve(key, consumer)


def simulate(objects: model.Objects, *, policy: alloc.Policy, search_limit: int) -> Result:
    """Run the whole simulation over decoded objects. Deterministic; no I/O.

    The timed phase runs from planning the claims and building the allocator (CEL compiled
    and evaluated there) through the last allocation; `Result.seconds` is its wall time.
    Raises `alloc.AllocationError` when the input cannot be allocated at all.
    """
    ledger = _Ledger(placement.Cluster.of(objects))
    start = time.perf_counter()
    plan = claims.plan(objects)
    snapshot = alloc.Snapshot(
        device_classes=objects.device_classes,
        resource_slices=objects.resource_slices,
        nodes=objects.nodes,
        allocated_claims=tuple(claim for claim in objects.resource_claims if claim.allocation is not None),
    )
    allocator = alloc.Allocator(snapshot, policy=policy, search_limit=search_limit)
    for claim in plan.standalone:
        ledger.add(key=claim.key, namespace=claim.meta.namespace, name=claim.meta.name, claim=claim)
        if claim.allocation is None:
            ledger.allocate(allocator, [claim], nodes=None, context=f"claim {claim.key}")
    for work in plan.pods:
        _place_pod(work, allocator=allocator, ledger=ledger)
    seconds = time.perf_counter() - start
    return Result(claims=ledger.outcomes(), attempted=ledger.attempted, seconds=seconds)
