"""The allocator: model values in, allocations and reasons out.

What it does: maps model values (classes, slices, nodes, claims) to indices, bitsets and
counters; evaluates CEL selectors once per (selector, device) and slice generation; runs
the Cython core (`dractl._alloc`) for the search and scoring; maps the chosen indices back
into `model.AllocationResult` values in exactly the API's shape; explains every failure.
What it must not do: see an API object (raw dicts), do I/O, or print.

Layout, one concern per module: `index` turns the snapshot into indices (pools per node,
counters, capacity slots, usage held by the input); `selectors` evaluates CEL selectors over
the devices; `plans` compiles claim specs into request shapes and plans for the core;
`ledger` keeps what each claim holds; `results` builds allocations in the API's shape;
`reasons` explains failures; `outcome` holds the values it answers with; `repack` the values of
the what-if (which held claims, moved, let a refused claim fit) and the order it tries them in.
This module is the service around them: the lock, inventory updates and rebuilds, the search
and the what-if's trials. The Cython core is reached only from this package.
"""

from __future__ import annotations

import array
import dataclasses
import heapq
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from dractl import _alloc, config, model
from dractl.alloc import index as allocindex
from dractl.alloc import ledger as allocledger
from dractl.alloc import outcome
from dractl.alloc import plans as allocplans
from dractl.alloc import reasons as allocreasons
from dractl.alloc import repack as allocrepack
from dractl.alloc import results as allocresults
from dractl.alloc import selectors as allocselectors

MAX_RESULTS = allocplans.MAX_RESULTS
"""Devices per claim (`AllocationResultsMaxSize`); the core takes it from here."""

# One definition for the CLI, the settings and the allocator: the settings layer sits lowest.
Policy = config.Policy

Reason = outcome.Reason
Outcome = outcome.Outcome
Repack = allocrepack.Repack
Move = allocrepack.Move

Rejection = allocindex.Rejection
"""Why an allocation given in the snapshot holds nothing (`Allocator.rejected`)."""
CONFLICT = allocindex.CONFLICT
"""`Rejection.kind` of an allocation that conflicts with another claim's (else it is invalid)."""

claim_id = allocledger.claim_id


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as the allocator sees it. Claims with `allocation` set hold their devices.

    With `check_allocated` they are checked in order, as for input a user wrote: a claim whose
    allocation conflicts with an earlier one or cannot be valid holds nothing (see
    `Allocator.rejected`). Without (the default, for the API's state, as the scheduler does),
    every allocation holds what it says, so an over-committed counter set blocks its consumers.
    """

    device_classes: Sequence[model.DeviceClass]
    resource_slices: Sequence[model.ResourceSlice]
    nodes: Sequence[model.Node] = ()
    allocated_claims: Sequence[model.ResourceClaim] = ()
    check_allocated: bool = False


_MAX_PLANS = 4096
"""Compiled claim plans kept; past this the cache starts over (specs are cheap to recompile)."""

_MAX_SHAPES = 8192
"""Request shapes registered with the core; past this the tables are rebuilt, which drops them."""


class _HasMeta(Protocol):
    @property
    def meta(self) -> model.ObjectMeta: ...


_Named = TypeVar("_Named", bound=_HasMeta)


def _by_name(objects: Sequence[_Named]) -> tuple[_Named, ...]:
    """Objects in name order: the order the API lists them in, whatever order they came in."""
    return tuple(sorted(objects, key=lambda o: o.meta.name))


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


class Allocator:
    """Allocates claims against a snapshot that later updates replace; every success is
    committed, so later calls see those devices, counters and capacity as used.

    Both policies search completely (they agree on whether claims fit). FIRST_FIT tries
    nodes by name and devices in upstream's order, so it makes upstream's choices. BINPACK
    tries first the nodes where the claim costs the known demand least, then the most used
    nodes, then names. The demand is the request shapes seen so far or made known by
    `consider`, each weighed by the devices the cluster holds for it: a shape's spare is the
    GPUs that could serve it minus its share of filling the rest of the cluster with the mix
    held now, and taking a GPU costs what it raises the scarcity of the shapes it serves (a
    full GPU counts the shapes of its MIG devices). Requests for several devices on one node
    (8 GPUs, an NVLink partition by `matchAttribute`) keep rooms: a placement that breaks a
    whole node or partition such a request could use costs that shape k GPUs of its spare, so
    smaller requests fill nodes and partitions already broken. Inside a node it prefers a PCIe
    root that holds the whole request, GPUs and counter sets already partly used, devices that
    break no room, the least wanted GPUs, and the partition that keeps the largest sibling
    partition placeable. FIRST_FIT keeps none of this demand. Share ids are UUIDv5 of (claim,
    request, device, result position): deterministic. Selector results are cached per
    (expression, device) for the allocator's life, and shared between devices that the
    expression cannot tell apart (`cel.sharing`: the expression provably reads only named
    members, and the devices are equal in all of them).

    CEL runtime errors: every selector is evaluated up front, but a device whose selector
    failed only ends the allocation when the search tries it, as upstream's lazy evaluation
    would: FIRST_FIT gives upstream's answer exactly (a device that matches earlier in the
    search wins; an All-mode request fails on any failing device of the node; a device in use
    is skipped before its selectors matter). BINPACK tries failing devices after every other
    candidate of the request, so the error ends the attempt only when nothing else fits.
    Nodes are searched in turn: a node searched before the one with the error may succeed.
    The reason names the claim, the (sub)request, the selector, the expression and the device.

    A long-lived service: claims hold what they were given under `claim_id` (a ledger) until
    `release`, which gives back exactly that; `hold` enters allocations made elsewhere;
    `update` swaps in new classes, slices and nodes, rebuilding the device tables only when
    something changed and keeping the selector results of unchanged devices. A controller
    allocates (assumes), writes, and releases when a write fails. Choices depend only on the
    inventory, what is held and the request shapes known (`consider`), not on call history.
    Thread-safe: one lock serializes every call (the core releases the GIL while searching).
    """

    def __init__(
        self, snapshot: Snapshot, *, policy: Policy = Policy.BINPACK, search_limit: int = config.DEFAULT_SEARCH_LIMIT
    ) -> None:
        self._binpack = policy is Policy.BINPACK
        self._limit = search_limit
        self._lock = threading.RLock()
        self._classes = {c.meta.name: c for c in snapshot.device_classes}
        self._slices = _by_name(snapshot.resource_slices)
        self._nodes = _by_name(snapshot.nodes)
        self._dirty = False
        self._selectors: allocselectors.Selectors | None = None
        # Refusals the what-if found no repack for, by (plans, nodes, shapes known), while nothing held changes: a
        # pending pod refused again and again (each scheduling cycle, each retry of a replay) costs one lookup. The
        # plans are kept so that their ids stay theirs.
        self._unrepackable: dict[tuple[object, ...], tuple[allocplans.Plan, ...]] = {}
        self._build(snapshot.allocated_claims, check=snapshot.check_allocated)
        self._rejected = self._index.rejected

    # --- public --------------------------------------------------------------------------

    @property
    def rejected(self) -> Mapping[str, tuple[Rejection, ...]]:
        """The snapshot's allocated claims (by "namespace/name") whose allocation holds
        nothing, with every reason: `kind` "conflict" when an earlier claim in the snapshot
        holds the device, its capacity or its counter set, "invalid" otherwise."""
        return self._rejected

    def allocate(self, claims: Sequence[model.ResourceClaim], *, nodes: Sequence[str] | None = None) -> Outcome:
        """Allocate `claims` jointly (they share one node) on one of `nodes` (None: any node),
        the node the policy picks. On success every claim holds its devices under
        `claim_id(claim)` until `release`; a claim that already holds devices is refused."""
        with self._lock:
            self._refresh()
            refused = self._ledger.refused(claims)
            if refused:
                return Outcome(node=None, allocations=None, reasons=refused)
            answer, taken = self._allocate(claims, nodes)
            if answer.allocations is not None:
                self._unrepackable.clear()
                for claim, allocation, indices in zip(claims, answer.allocations, taken, strict=True):
                    self._ledger.record(claim, allocation, indices)
            return answer

    def repack(
        self,
        claims: Sequence[model.ResourceClaim],
        *,
        nodes: Sequence[str] | None = None,
        max_moves: int = allocrepack.MAX_MOVES,
        max_candidates: int = allocrepack.MAX_CANDIDATES,
    ) -> Repack | None:
        """What if held claims moved: the fewest held claims (then the fewest devices) that, released, let `claims`
        fit jointly on one of `nodes` (None: any node), each with a new place that fits at the same time, so that a
        consolidation could move them rather than only evict them. None when no plan is found within the bound or the
        claims cannot be allocated at all (compile errors, a claim already holding devices); a plan without moves
        when they fit as things are.

        The bound: at most `max_candidates` held claims are considered, those holding devices on the `max_candidates`
        candidate nodes closest to taking the claims (nodes with enough candidates of their first request's first
        alternative before the others, then the most such devices free first), fewest devices first within a node; and
        at most `max_moves` of them move at once, so at most C(n, 1) + ... + C(n, max_moves) sets are tried. If
        releasing every candidate at once does not let the claims fit, no set of them can, and nothing more is tried.
        For each set, released together: the claims are placed first and then each moved claim (largest first) anywhere
        it fits, else the moved claims first and then the claims, else all of them jointly on one node (complete for
        that node). The moved claims' new places ignore where their pods may run (the allocator knows no pods).

        Deterministic (the same inventory and holdings give the same answer). Leaves the allocator as it was: every
        trial placement is given back and every released claim restored before it returns, whatever happens."""
        with self._lock:
            self._refresh()
            if not claims or self._ledger.refused(claims):
                return None
            return self._trial(claims, nodes, ()) or self._repack(
                claims, nodes, max_moves=max_moves, max_candidates=max_candidates
            )

    def consider(self, claims: Sequence[model.ResourceClaim]) -> None:
        """Make the request shapes of claims that are expected to come (pending claims) known,
        without allocating. Binpack keeps devices for the shapes it knows: a controller calls
        this with every pending claim, so that its choices depend on what is held and pending,
        not on which claims it happened to see since it started."""
        with self._lock:
            self._refresh()
            for claim in claims:
                self._compiler.plan(claim.spec)

    def release(self, claim: str) -> bool:
        """Give back exactly what the claim (`claim_id`) holds: devices, shares, consumed
        capacity and, with the last holder of a device, its counters. False when it held nothing."""
        with self._lock:
            holding = self._ledger.pop(claim)
            if holding is None:
                return False
            self._unrepackable.clear()
            if not self._dirty:
                self._ledger.apply(holding, -1)
            return True

    def hold(self, claim: model.ResourceClaim) -> None:
        """Make the claim hold the allocation it carries, unchecked, as the API's state is the
        truth (an allocation kube-scheduler made, or dractl's own seen again after a restart).
        The same allocation again changes nothing; another one replaces it; a claim without an
        allocation holds nothing afterwards."""
        key = claim_id(claim)
        with self._lock:
            existing = self._ledger.get(key)
            if existing is not None and existing.allocation == claim.allocation:
                return
            self.release(key)
            if claim.allocation is None:
                return
            self._unrepackable.clear()
            self._ledger.hold(claim, claim.allocation, stale=self._dirty)

    def contested(self, claim: str) -> str | None:
        """Why another claim holds what the claim (`claim_id`) holds, naming that claim, or None (also when the claim
        holds nothing): a device both hold where either holds it whole (shares of a device that allows several
        allocations coexist), or a counter its devices draw that the devices held together overdraw. `hold` enters
        allocations made elsewhere unchecked, as the API's state is the truth; a controller that allocated the claim
        and then held what another scheduler wrote asks here whether the two overlap."""
        with self._lock:
            self._refresh()
            return self._ledger.contested(claim)

    def held(self, claim: str) -> model.AllocationResult | None:
        """The allocation the claim (`claim_id`) holds, if any."""
        with self._lock:
            holding = self._ledger.get(claim)
            return None if holding is None else holding.allocation

    def update(
        self,
        *,
        device_classes: Sequence[model.DeviceClass] | None = None,
        resource_slices: Sequence[model.ResourceSlice] | None = None,
        nodes: Sequence[model.Node] | None = None,
    ) -> None:
        """Replace the given sets wholesale (None keeps a set). Nothing is rebuilt when they
        are equal to what the allocator has; otherwise the next call rebuilds the device tables
        from the new sets and the held claims, keeping every selector result of a device whose
        pool generation, slice and content are unchanged."""
        with self._lock:
            if device_classes is not None:
                classes = {c.meta.name: c for c in device_classes}
                if classes != self._classes:
                    self._classes = classes
                    self._dirty = True
            if resource_slices is not None:
                slices = _by_name(resource_slices)
                if not _same(slices, self._slices):
                    self._slices = slices
                    self._dirty = True
            if nodes is not None:
                node_list = _by_name(nodes)
                if not _same(node_list, self._nodes):
                    self._nodes = node_list
                    self._dirty = True

    def usage(self) -> tuple[bytes, list[int], list[int], list[int], list[int], list[int]]:
        """The core's usage tables (devices in use, shares, counters, capacity, per node held
        and used), for tests that check a release gives back exactly what was taken."""
        with self._lock:
            self._refresh()
            return self._core.usage()

    # --- builds ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Rebuild after a change of inventory, or when the caches outgrow their bounds."""
        if len(self._compiler.plans) > _MAX_PLANS:
            self._compiler.forget_plans()
        if self._dirty or len(self._compiler.shapes) > _MAX_SHAPES:
            held = [
                h.claim if h.claim.allocation is h.allocation else dataclasses.replace(h.claim, allocation=h.allocation)
                for h in self._ledger
            ]
            self._build(held, check=False)

    def _build(self, allocated: Sequence[model.ResourceClaim], *, check: bool) -> None:
        """The device tables, the core, the compiler and the ledger for the current sets, holding
        `allocated`; selector results of unchanged devices carry over from the previous build."""
        index = allocindex.Index(slices=self._slices, nodes=self._nodes, allocated=allocated, check=check)
        self._core = _alloc.Core(
            node_off=index.node_off,
            node_dev=index.node_dev,
            node_bad=index.node_bad,
            cons_off=index.cons_off,
            cons_id=index.cons_id,
            cons_amt=index.cons_amt,
            chk_off=index.chk_off,
            chk_id=index.chk_id,
            cnt_avail=index.cnt_avail,
            cnt_total=index.cnt_total,
            cnt_set=index.cnt_set,
            set_off=index.set_off,
            set_dev=index.set_dev,
            in_use=index.in_use,
            multi=index.multi,
            shares=index.shares,
            slot_value=index.slot_value,
            slot_used=index.slot_used,
            dev_group=index.dev_group,
            n_groups=index.n_groups,
            max_results=MAX_RESULTS,
            policy=_alloc.POLICY_BINPACK if self._binpack else _alloc.POLICY_FIRST_FIT,
        )
        self._selectors = allocselectors.Selectors(index=index, classes=self._classes, previous=self._selectors)
        self._index = index
        self._node_ids = {name: i for i, name in enumerate(index.node_names) if name is not None}
        self._all_nodes = array.array("i", range(len(index.node_names)))
        self._last_nodes: tuple[tuple[str, ...], array.array[int]] | None = None
        self._compiler = allocplans.Compiler(
            core=self._core, index=index, classes=self._classes, selectors=self._selectors, binpack=self._binpack
        )
        self._ledger = allocledger.Ledger(core=self._core, index=index, compiler=self._compiler, binpack=self._binpack)
        for claim in allocated:
            if claim.allocation is None or claim.key in index.rejected:
                continue
            self._ledger.enter(claim, claim.allocation)
        self._unrepackable.clear()
        self._dirty = False

    # --- the search ------------------------------------------------------------------------

    def _allocate(
        self, claims: Sequence[model.ResourceClaim], nodes: Sequence[str] | None, *, explain: bool = True
    ) -> tuple[Outcome, list[list[int]]]:
        """Search and commit in the core; on success also the device index of every result. Without `explain` a
        failure comes without reasons (the what-if's trials need only whether it fits)."""
        if not claims:
            return Outcome(node=None, allocations=()), []
        plans = [self._compiler.plan(claim.spec) for claim in claims]
        if any(plan.errors for plan in plans):
            reasons = (
                Reason(claim.key, request, message)
                for claim, plan in zip(claims, plans, strict=True)
                for request, message in plan.errors
            )
            return Outcome(node=None, allocations=None, reasons=tuple(reasons)), []
        encoded = plans[0].encoded if len(plans) == 1 else allocplans.encode(plans)
        assert encoded is not None
        node_array = None if nodes is None else self._node_array(nodes)
        status, node, alts, devices, requests, stats = self._core.search(
            encoded, node_array, limit=self._limit, commit=True
        )
        if status == _alloc.CEL_ERROR:
            reason = allocreasons.cel_error(claims, plans, alt=alts[0], device=devices[0])
            return Outcome(node=None, allocations=None, reasons=(reason,)), []
        if status != _alloc.OK and not explain:
            return Outcome(node=None, allocations=None), []
        if status != _alloc.OK:
            explained = allocreasons.explain(
                claims,
                plans,
                core=self._core,
                index=self._index,
                compiler=self._compiler,
                status=status,
                stats=stats,
                node_array=node_array,
                all_nodes=self._all_nodes,
                limit=self._limit,
            )
            if status == _alloc.NO_FIT:
                explained += self._repack_reason(claims, nodes)
            return Outcome(node=None, allocations=None, reasons=explained), []
        return allocresults.build(
            claims,
            plans,
            index=self._index,
            classes=self._classes,
            node=node,
            alts=alts,
            devices=devices,
            requests=requests,
        )

    def _node_array(self, nodes: Sequence[str]) -> array.array[int]:
        """The core's ids of `nodes` (those it knows), sorted. The last answer for a tuple is kept and given again
        for the same tuple object: the scheduler passes one tuple per pod shape until its node filter's answer
        changes, so a burst of like pods converts it once. Rebuilt inventories start over (`_build`)."""
        last = self._last_nodes
        if last is not None and last[0] is nodes:
            return last[1]
        found = array.array("i", sorted({self._node_ids[n] for n in nodes if n in self._node_ids}))
        if isinstance(nodes, tuple):
            self._last_nodes = (nodes, found)
        return found

    # --- the what-if -------------------------------------------------------------------------

    def _repack_reason(self, claims: Sequence[model.ResourceClaim], nodes: Sequence[str] | None) -> tuple[Reason, ...]:
        """The reason that names a repack of at most `allocrepack.MAX_MOVES` moves admitting the refused `claims`, if
        the what-if finds one. Information only: nothing moves."""
        plans = tuple(self._compiler.plan(claim.spec) for claim in claims)
        key = (*(id(p) for p in plans), None if nodes is None else tuple(nodes), len(self._compiler.shapes))
        if key in self._unrepackable:
            return ()
        plan = self._repack(claims, nodes, max_moves=allocrepack.MAX_MOVES, max_candidates=allocrepack.MAX_CANDIDATES)
        if plan is None or not plan.moves:
            if len(self._unrepackable) >= _MAX_PLANS:
                self._unrepackable.clear()
            self._unrepackable[key] = plans
            return ()
        them = "it" if len(claims) == 1 else "them"
        return (Reason(claims[0].key, None, f"a repack would admit {them}: {plan.describe()}"),)

    def _repack(
        self, claims: Sequence[model.ResourceClaim], nodes: Sequence[str] | None, *, max_moves: int, max_candidates: int
    ) -> Repack | None:
        """`repack` under the lock, on refreshed tables, for claims that do not fit as things are."""
        plans = [self._compiler.plan(claim.spec) for claim in claims]
        if any(plan.errors for plan in plans):
            return None
        candidates = self._candidates(plans, nodes, limit=max_candidates)
        if not candidates or not self._released_fit(claims, nodes, candidates):
            return None
        for subset in allocrepack.subsets(candidates, max_moves=max_moves):
            found = self._trial(claims, nodes, subset)
            if found is not None:
                return found
        return None

    def _candidates(
        self, plans: Sequence[allocplans.Plan], nodes: Sequence[str] | None, *, limit: int
    ) -> list[allocrepack.Candidate]:
        """The held claims the what-if may move, best first, at most `limit` (see `repack`)."""
        node_array = self._all_nodes if nodes is None else self._node_array(nodes)
        alt = next((options[0] for plan in plans for options in plan.requests if options), None)
        if alt is None or not node_array:
            return []
        need = 1 if alt.all_mode else alt.count
        total = self._core.free_per_node(alt.shape.shape_id, admin=True, nodes=node_array)
        free = self._core.free_per_node(alt.shape.shape_id, admin=False, nodes=node_array)
        # Nodes with too few such devices come last rather than not at all: another alternative may fit there.
        ranked = sorted(range(len(node_array)), key=lambda i: (total[i] < need, -free[i], i))
        # Each of the `limit` best nodes that holds anything gives a candidate, and candidates are taken best node
        # first, so farther nodes could only fill in for best nodes that hold nothing: they are not looked at.
        rank_of: dict[int, int] = {}  # device -> rank of the best ranked node that sees it
        index = self._index
        for rank, i in enumerate(ranked[:limit]):
            node = node_array[i]
            for k in range(index.node_off[node], index.node_off[node + 1]):
                rank_of.setdefault(index.node_dev[k], rank)
        unseen = limit
        scored = []
        get = rank_of.get
        for key, holding in self._ledger.items():
            best = unseen
            for d, _ in holding.devices:
                best = min(best, get(d, unseen))
            if best < unseen:
                scored.append((best, len(holding.devices), key))
        return [allocrepack.Candidate(key, devices, rank) for rank, devices, key in heapq.nsmallest(limit, scored)]

    def _released_fit(
        self,
        claims: Sequence[model.ResourceClaim],
        nodes: Sequence[str] | None,
        candidates: Sequence[allocrepack.Candidate],
    ) -> bool:
        """Whether `claims` fit with every candidate released: if not, no set of them lets them fit."""
        released = self._release_all(candidates)
        try:
            return self._fits(claims, nodes)
        finally:
            for holding in released:
                self._ledger.restore(holding)

    def _trial(
        self,
        claims: Sequence[model.ResourceClaim],
        nodes: Sequence[str] | None,
        subset: Sequence[allocrepack.Candidate],
    ) -> Repack | None:
        """The plan that moves exactly `subset`, if one of the orders in `repack` finds new places for all; the
        ledger and the core are restored before it returns."""
        released = self._release_all(subset)
        try:
            # Placing more never frees anything: if the claims do not fit alone now, no order of this set helps.
            if subset and not self._fits(claims, nodes):
                return None
            # Larger claims are harder to place: they go first.
            moved = [h.claim for h in sorted(released, key=lambda h: (-len(h.devices), h.claim.key))]
            orders: list[list[tuple[Sequence[model.ResourceClaim], Sequence[str] | None]]] = [
                [(claims, nodes), *(([claim], None) for claim in moved)],
                [*(([claim], None) for claim in moved), (claims, nodes)],
            ]
            if moved:
                orders.append([((*claims, *moved), nodes)])
            for order in orders:
                placed = self._place(order)
                if placed is not None:
                    return self._plan(claims, released, placed)
            return None
        finally:
            for holding in released:
                self._ledger.restore(holding)

    def _fits(self, claims: Sequence[model.ResourceClaim], nodes: Sequence[str] | None) -> bool:
        """Whether `claims` fit jointly on one of `nodes` as things are: a search that holds nothing."""
        plans = [self._compiler.plan(claim.spec) for claim in claims]
        encoded = plans[0].encoded if len(plans) == 1 else allocplans.encode(plans)
        assert encoded is not None
        node_array = None if nodes is None else self._node_array(nodes)
        status = self._core.search(encoded, node_array, limit=self._limit, commit=False)[0]
        return status == _alloc.OK

    def _release_all(self, subset: Sequence[allocrepack.Candidate]) -> list[allocledger.Holding]:
        released = []
        for candidate in subset:
            holding = self._ledger.pop(candidate.claim_id)
            assert holding is not None
            self._ledger.apply(holding, -1)
            released.append(holding)
        return released

    def _place(
        self, steps: Sequence[tuple[Sequence[model.ResourceClaim], Sequence[str] | None]]
    ) -> dict[str, tuple[model.AllocationResult, str | None]] | None:
        """Allocate each step's claims in turn (each step jointly on one of its nodes), then give every placement
        back: by claim key, each allocation and node, or None when a step does not fit."""
        placed: list[str] = []
        found: dict[str, tuple[model.AllocationResult, str | None]] = {}
        try:
            for group, where in steps:
                answer, taken = self._allocate(group, where, explain=False)
                if answer.allocations is None:
                    return None
                for claim, allocation, indices in zip(group, answer.allocations, taken, strict=True):
                    self._ledger.record(claim, allocation, indices)
                    placed.append(claim_id(claim))
                    found[claim.key] = (allocation, answer.node)
            return found
        finally:
            for key in reversed(placed):
                holding = self._ledger.pop(key)
                assert holding is not None
                self._ledger.apply(holding, -1)

    def _plan(
        self,
        claims: Sequence[model.ResourceClaim],
        released: Sequence[allocledger.Holding],
        placed: Mapping[str, tuple[model.AllocationResult, str | None]],
    ) -> Repack:
        moves = []
        for holding in released:
            assert holding.allocation is not None
            after, node = placed[holding.claim.key]
            moves.append(
                allocrepack.Move(
                    claim=holding.claim.key,
                    claim_id=claim_id(holding.claim),
                    before=holding.allocation,
                    before_node=self._node_holding(holding),
                    after=after,
                    after_node=node,
                )
            )
        return Repack(
            moves=tuple(moves),
            node=placed[claims[0].key][1],
            allocations=tuple(placed[claim.key][0] for claim in claims),
        )

    def _node_holding(self, holding: allocledger.Holding) -> str | None:
        """The one node that sees every device the holding takes, else the one its allocation's selector names."""
        devices = {d for d, _ in holding.devices}
        index = self._index
        seeing = [
            name
            for node, name in enumerate(index.node_names)
            if name is not None
            and devices <= {index.node_dev[k] for k in range(index.node_off[node], index.node_off[node + 1])}
        ]
        if len(seeing) == 1:
            return seeing[0]
        assert holding.allocation is not None
        return allocrepack.node_of(holding.allocation)
