"""The scheduler's decision: which node and which devices a pod gets, assumed in memory before anything is written.

What it does: `Planner.decide` takes a pod and its resolved claims and returns a plain value:
a `Decision` (the node, the claims to allocate with their allocations, the allocated claims to
reserve), a `Refusal` (the message for the pod, and whether a change of the cluster may help)
or a `Wait` (for a claim another decision is writing). It filters the nodes (`schedfit`, then
pinned to the node selectors of claims already allocated), allocates the pod's unallocated
claims together on one of the remaining nodes (`alloc`), and assumes the result: the allocator
holds the devices, the ledger marks the claims in flight, the pod counts on its node. Decisions
are made one at a time (one lock around filter, allocate and assume), so two workers never
count the same free CPU or device twice. A decision for several pods at once (a PodGroup, with
`dractl.gang`) belongs here as a method of its own under the same lock, returning plain values
the same way.

What it must not do: talk to the API, read a cache other than through `schedfit` and the
`ledger`, or write anything: the commit (`schedcommit`) writes a `Decision`, and takes it back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from dractl import model
from dractl.controller import schedfit, schedledger, schedplan


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """A pod assumed on `node`: the claims to allocate with their allocations, the allocated claims to reserve."""

    node: str
    allocate: tuple[tuple[model.ResourceClaim, model.AllocationResult], ...] = ()
    reserve: tuple[model.ResourceClaim, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """The pod cannot be scheduled now: `message` goes on the pod. `retry`: try again when the cluster changes."""

    message: str
    retry: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """The pod waits for something that will happen by itself: a change of `claim` (`namespace/name`), or of the
    pod itself when `claim` is ""."""

    reason: str
    claim: str = ""


class Planner:
    """Decides for one pod at a time over `allocator`, `ledger` and `fit`. Thread-safe (decisions are serialized)."""

    def __init__(
        self, *, allocator: schedledger.AllocatorService, ledger: schedledger.Ledger, fit: schedfit.NodeFit
    ) -> None:
        self._allocator = allocator
        self._ledger = ledger
        self._fit = fit
        self._lock = threading.Lock()  # one decision at a time: filter, allocate, assume

    def decide(self, pod: schedplan.PodInfo, resolved: Sequence[model.ResourceClaim]) -> Decision | Refusal | Wait:
        """Pick the node and the devices for `pod` with its `resolved` claims, and assume them (a `Decision`: the
        allocator holds the devices, the claims to allocate are in flight, the pod counts on the node). Not
        idempotent: a `Decision` must be written or taken back (`schedcommit`), and the claims ended in flight."""
        assert pod.needs is not None  # unsupported_message refused pods without needs
        split = schedplan.split_claims(pod, resolved)
        if split.problem is not None:
            return Refusal(split.problem)
        with self._lock:
            busy = self._ledger.busy(split.allocate)
            if busy is not None:
                # Another decision is writing it, or wrote it and the cache is behind: its allocation
                # will show up as an event that queues this pod again.
                return Wait(f"ResourceClaim {busy.key} is being allocated", claim=busy.key)
            feasible, reasons, infos = self._fit.filter(pod.needs)
            if split.allocated:
                labels = {info.name: info.labels for info in infos}
                feasible, reasons = schedplan.pin(feasible, reasons, labels=labels, allocated=split.allocated)
            if not feasible:
                return Refusal(schedplan.unschedulable_message(node_reasons=reasons, total=len(infos)))
            node = feasible[0]
            allocations: tuple[model.AllocationResult, ...] = ()
            if split.allocate:
                outcome = self._allocator.allocate(split.allocate, nodes=feasible)
                if not outcome.ok or outcome.allocations is None:
                    reasons.update((name, schedplan.CANNOT_ALLOCATE) for name in feasible)
                    return Refusal(
                        schedplan.unschedulable_message(node_reasons=reasons, total=len(infos), outcome=outcome.reasons)
                    )
                allocations = outcome.allocations
                if outcome.node is not None:
                    node = outcome.node
            self._ledger.begin(split.allocate)
            self._fit.assume(pod.key, uid=pod.uid, needs=dataclasses.replace(pod.needs, node_name=node))
        return Decision(node=node, allocate=tuple(zip(split.allocate, allocations, strict=True)), reserve=split.reserve)
