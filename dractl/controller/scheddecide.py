"""The scheduler's decision: which node and which devices a pod gets, assumed in memory before anything is written.

What it does: `Planner.decide` takes a pod and its resolved claims and returns a plain value:
a `Decision` (the node, the claims to allocate with their allocations, the allocated claims to
reserve), a `Refusal` (the message for the pod, and whether a change of the cluster may help)
or a `Wait` (for a claim another decision is writing). It filters the nodes (`schedfit`, then
pinned to the node selectors of claims already allocated), allocates the pod's unallocated
claims together on one of the remaining nodes (`alloc`), and assumes the result: the allocator
holds the devices, the ledger marks the claims in flight, the pod counts on its node. Decisions
are made one at a time (one lock around filter, allocate and assume), so two workers never
count the same free CPU or device twice. `Planner.decide_gang` decides for the pending pods of
one PodGroup at once under the same lock (`dractl.gang`: all members in one topology domain, at
least `minCount` of them or none) and returns a `GangDecision` (a `Decision` per placed pod), a
`Refusal` for the whole gang (the gang's one line) or a `Wait`.

What it must not do: talk to the API, read a cache other than through `schedfit` and the
`ledger`, or write anything: the commit (`schedcommit`) writes a `Decision`, and takes it back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from dractl import alloc, gang, model
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


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A pending pod of a gang with its resolved claims, or why it cannot be placed (`problem`)."""

    pod: schedplan.PodInfo
    claims: tuple[model.ResourceClaim, ...] = ()
    problem: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GangDecision:
    """A gang assumed in one domain (`domain`: `label=value`, None for the whole cluster): a `Decision` per placed pod
    (at least the gang's need of them), and the pods left out with the message for each."""

    placed: tuple[tuple[schedplan.PodInfo, Decision], ...]
    left: tuple[tuple[schedplan.PodInfo, str], ...]
    domain: str | None


class Planner:
    """Decides for one pod at a time over `allocator`, `ledger` and `fit`. Thread-safe (decisions are serialized)."""

    def __init__(
        self,
        *,
        allocator: schedledger.AllocatorService,
        ledger: schedledger.Ledger,
        fit: schedfit.NodeFit,
        levels: Sequence[str] = (),
    ) -> None:
        self._allocator = allocator
        self._ledger = ledger
        self._fit = fit
        self._levels = tuple(levels)
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

    def decide_gang(
        self, group: model.PodGroup, candidates: Sequence[Candidate], *, running: Sequence[str] = ()
    ) -> GangDecision | Refusal | Wait:
        """Place the pending pods of `group` as one decision (`gang.plan`) and assume the placed ones as `decide` does.

        `running` are the nodes of the group's pods already bound (or assumed): then the candidates join a gang that
        runs, go to its domain (`gang.running_domains`, the narrowest of the preferred levels first) and need only
        make up the rest of its `minCount`. Node fit is `decide`'s per pod, against what the members placed before
        it take. Not idempotent, as `decide`: every `Decision` of a `GangDecision` must be written or taken back."""
        need = max(1, (group.min_count or 1) - len(running))
        head = gang.describe(group)
        members: list[gang.Member] = []
        splits: dict[str, schedplan.Split] = {}
        allocating: dict[str, str] = {}  # claim key -> the pod of this gang that allocates it
        for candidate in candidates:
            pod, problem = candidate.pod, candidate.problem
            split = schedplan.split_claims(pod, candidate.claims) if problem is None else schedplan.Split()
            problem = problem or split.problem
            shared = next((claim for claim in split.allocate if claim.key in allocating), None)
            if problem is None and shared is not None:
                # Its reservation would be written before the allocation it adds to: it joins once that is written.
                problem = f"shares ResourceClaim {shared.key} with pod {allocating[shared.key]}, not allocated yet"
            if problem is None:
                allocating.update((claim.key, pod.key) for claim in split.allocate)
            splits[pod.key] = split
            members.append(gang.Member(key=pod.key, claims=split.allocate, problem=problem))
        by_key = {candidate.pod.key: candidate.pod for candidate in candidates}
        with self._lock:
            busy = self._ledger.busy(claim for split in splits.values() for claim in split.allocate)
            if busy is not None:
                return Wait(f"ResourceClaim {busy.key} is being allocated", claim=busy.key)
            cluster = self._fit.cluster()
            members = [self._fitting(member, by_key[member.key], splits[member.key]) for member in members]
            if running:
                domains = gang.running_domains(cluster, running, key=group.topology_key, levels=self._levels)
                if not domains:
                    return Refusal(f"{head}: its running pods are not in one domain of {group.topology_key}")
                within = set(gang.domain_nodes(cluster, domains[-1]))
                # The joiners as a group of their own: their need, and no key (each try gives the domain's nodes).
                joining = dataclasses.replace(group, min_count=need, topology_key=None)
                plan: gang.Plan | None = None
                for domain in domains:
                    nodes = tuple(n for n in gang.domain_nodes(cluster, domain) if n in within)
                    tried = [_within(member, nodes) for member in members]
                    plan = gang.plan(self._allocator, joining, members=tried, cluster=cluster)
                    if plan.ok:
                        plan = dataclasses.replace(plan, domain=domain)
                        members = tried
                        break
                assert plan is not None  # `domains` is not empty
                if not plan.ok:
                    where = domains[-1] or "the cluster"
                    why = "; ".join(dict.fromkeys(r for item in plan.left for r in item.reasons[1:])) or plan.reason
                    return Refusal(f"{head} runs in {where}; the pods joining it do not fit there: {why}")
            else:
                plan = gang.plan(self._allocator, group, members=members, cluster=cluster, levels=self._levels)
                if not plan.ok:
                    assert plan.reason is not None
                    return Refusal(plan.reason)
                if plan.domain is not None:
                    # A member no claim pins to one node picks its node below: only within the gang's domain.
                    nodes = gang.domain_nodes(cluster, plan.domain)
                    members = [_within(member, nodes) for member in members]
            placed = self._assume_gang(plan, head=head, by_key=by_key, splits=splits, members=members)
            if isinstance(placed, Refusal):
                return placed
        where = plan.domain or "the cluster"
        left = tuple(
            (by_key[item.key], f"{head} is placed in {where} without this pod: " + "; ".join(item.reasons))
            for item in plan.left
        )
        return GangDecision(placed=placed, left=left, domain=plan.domain)

    def _fitting(self, member: gang.Member, pod: schedplan.PodInfo, split: schedplan.Split) -> gang.Member:
        """The member with the nodes it may use (`decide`'s filter, pinned by its allocated claims), or with the
        node summary as its problem. Under `_lock`."""
        if member.problem is not None:
            return member
        assert pod.needs is not None  # unsupported_message refused pods without needs
        feasible, reasons, infos = self._fit.filter(pod.needs)
        if split.allocated:
            labels = {info.name: info.labels for info in infos}
            feasible, reasons = schedplan.pin(feasible, reasons, labels=labels, allocated=split.allocated)
        if not feasible:
            return dataclasses.replace(
                member, problem=schedplan.unschedulable_message(node_reasons=reasons, total=len(infos))
            )
        return dataclasses.replace(member, nodes=tuple(feasible))

    def _assume_gang(
        self,
        plan: gang.Plan,
        *,
        head: str,
        by_key: dict[str, schedplan.PodInfo],
        splits: dict[str, schedplan.Split],
        members: Sequence[gang.Member],
    ) -> tuple[tuple[schedplan.PodInfo, Decision], ...] | Refusal:
        """Assume the placed members one by one on their nodes, each checked by the node filter against the members
        assumed before it (two pods of a gang may pick one node whose CPU holds only one). Takes the whole plan back
        and refuses when one no longer fits. Under `_lock`."""
        allowed = {member.key: member.nodes for member in members}
        placed: list[tuple[schedplan.PodInfo, Decision]] = []
        for item in plan.placed:
            pod = by_key[item.key]
            assert pod.needs is not None
            feasible = set(self._fit.filter(pod.needs)[0])
            choices = (item.node,) if item.node is not None else allowed[item.key] or ()
            node = next((name for name in choices if name in feasible), None)
            if node is None:
                for undo, _ in placed:
                    self._fit.unassume(undo.key, undo.uid)
                for held in plan.placed:
                    for claim, _ in held.allocations:
                        self._allocator.release(alloc.claim_id(claim))
                return Refusal(f"{head}: no node left for pod {pod.key} once the gang's other pods are counted")
            self._fit.assume(pod.key, uid=pod.uid, needs=dataclasses.replace(pod.needs, node_name=node))
            decision = Decision(node=node, allocate=item.allocations, reserve=splits[item.key].reserve)
            placed.append((pod, decision))
        self._ledger.begin(claim for item in plan.placed for claim, _ in item.allocations)
        return tuple(placed)


def _within(member: gang.Member, nodes: tuple[str, ...]) -> gang.Member:
    """The member limited to `nodes` (the domain of the gang it joins)."""
    within = set(nodes)
    allowed = nodes if member.nodes is None else tuple(n for n in member.nodes if n in within)
    return dataclasses.replace(member, nodes=allowed)
