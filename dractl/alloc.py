"""The allocation facade: model values in, allocations and reasons out.

What it does: maps model values (classes, slices, nodes, claims) to indices, bitsets and
counters; evaluates CEL selectors once per (selector, device) and slice generation; runs
the Cython core (`dractl._alloc`) for the search and scoring; maps the chosen indices back
into `model.AllocationResult` values in exactly the API's shape; explains every failure.
What it must not do: see an API object (raw dicts), do I/O, or print.

Layout: `_allocindex` turns the snapshot into indices (pools per node, counters, capacity
slots, usage held by the input); this module compiles requests into shapes and claims into
plans, calls the core, and builds results and reasons.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import threading
import uuid
from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

from dractl import _alloc, _allocindex, cel, config, model

MAX_RESULTS = model.limits.MAX_RESULTS
"""Devices per claim (`AllocationResultsMaxSize`); the core takes it from here."""

_SHARE_NAMESPACE = uuid.UUID("6c1b2f57-2f0a-4b5e-9b1e-0d5a1c3d7e21")
"""Namespace of the deterministic share ids (UUIDv5 of claim, request, device and position)."""

_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

# One definition for the CLI, the settings and the allocator: the settings layer sits lowest.
Policy = config.Policy


Rejection = _allocindex.Rejection
"""Why an allocation given in the snapshot holds nothing (`Allocator.rejected`)."""
CONFLICT = _allocindex.CONFLICT
"""`Rejection.kind` of an allocation that conflicts with another claim's (else it is invalid)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    """One thing a person can act on. `request` is "req" or "req/sub", or None for the claim."""

    claim: str  # "namespace/name"
    request: str | None
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """The answer for one `Allocator.allocate` call.

    On success `allocations` holds one result per claim (same order) and `node` the chosen
    node (None when the devices are usable on every node). On failure `allocations` is None
    and `reasons` says why, per claim and request.
    """

    node: str | None
    allocations: tuple[model.AllocationResult, ...] | None
    reasons: tuple[Reason, ...] = ()

    @property
    def ok(self) -> bool:
        return self.allocations is not None


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


def claim_id(claim: model.ResourceClaim) -> str:
    """How the allocator names a claim: its UID, or "namespace/name" when it has none (manifests)."""
    return claim.meta.uid or claim.key


_MAX_PLANS = 4096
"""Compiled claim plans kept; past this the cache starts over (specs are cheap to recompile)."""

_MAX_SHAPES = 8192
"""Request shapes registered with the core; past this the tables are rebuilt, which drops them."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Holding:
    """What one claim holds: the claim (whose own `allocation` may be unset: it was allocated
    here), its allocation, and in the current tables each device it takes (index, as a share),
    each capacity it consumes (device, slot, amount) and the devices it holds per request shape
    (shape id, devices; binpack weighs the shapes by what the cluster holds)."""

    claim: model.ResourceClaim
    allocation: model.AllocationResult | None
    devices: tuple[tuple[int, bool], ...]
    slots: tuple[tuple[int, int, int], ...]
    shapes: tuple[tuple[int, int], ...] = ()


class _HasMeta(Protocol):
    @property
    def meta(self) -> model.ObjectMeta: ...


_Named = TypeVar("_Named", bound=_HasMeta)


def _by_name(objects: Sequence[_Named]) -> tuple[_Named, ...]:
    """Objects in name order: the order the API lists them in, whatever order they came in."""
    return tuple(sorted(objects, key=lambda o: o.meta.name))


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


# --- Shapes: one per distinct (class, selectors, tolerations, capacity, admin) -------------


@dataclasses.dataclass(slots=True)
class _Shape:
    """The candidates of one request shape, registered with the core as `shape_id`."""

    shape_id: int = -1
    error: str | None = None  # the request cannot be allocated at all (class, CEL)
    class_matches: int = 0
    selected: int = 0  # of those, passing the request's selectors
    fitting: int = 0  # of those, with the requested capacity
    candidates: int = 0  # of those, without an untolerated taint
    # (devices, constraint attribute id or -1) its requests asked for: binpack's kinds of room.
    demands: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    consumed: dict[int, dict[str, model.quantity.Quantity]] = dataclasses.field(default_factory=dict)  # shares
    # Devices where a class or request selector failed at run time, with the message; the
    # core ends the search with it when it tries one of them.
    failed: dict[int, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class _ClassMask:
    """A class's selectors over every device: matches, runtime failures, compile error."""

    mask: bytearray
    failed: dict[int, str]
    error: str | None
    matches: int


# Per (expression, device) evaluation states.
_UNKNOWN, _NO_MATCH, _MATCH, _FAILED = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True, slots=True)
class _Alt:
    """One way to satisfy a request: the request itself or one of its subrequests."""

    request: str  # the top-level request name
    name: str  # the result name: "req" or "req/sub"
    class_name: str
    shape: _Shape
    all_mode: bool
    count: int
    admin: bool
    tolerations: tuple[model.DeviceToleration, ...]


@dataclasses.dataclass(slots=True)
class _Plan:
    """One claim spec compiled for the core. `requests[r]` lists the alternatives in order."""

    requests: list[list[_Alt]]
    constraints: list[tuple[int, int, str, list[tuple[int, int]]]]  # (kind, attr id, text, [(req, alt)])
    config: tuple[model.DeviceClaimConfiguration, ...]
    errors: list[tuple[str | None, str]]
    encoded: array.array[int] | None = None
    configs: dict[tuple[int, ...], tuple[model.DeviceAllocationConfiguration, ...]] = dataclasses.field(
        default_factory=dict
    )


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
    partition placeable. Share ids are UUIDv5 of (claim, request, device,
    result position): deterministic. Selector results are cached per (expression, device)
    for the allocator's life, and shared between devices that the expression cannot tell
    apart (`cel.sharing`: the expression provably reads only named members, and the devices
    are equal in all of them).

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
        self._policy_code = _alloc.POLICY_BINPACK if policy is Policy.BINPACK else _alloc.POLICY_FIRST_FIT
        self._limit = search_limit
        self._lock = threading.RLock()
        self._classes = {c.meta.name: c for c in snapshot.device_classes}
        self._slices = _by_name(snapshot.resource_slices)
        self._nodes = _by_name(snapshot.nodes)
        self._holdings: dict[str, _Holding] = {}
        self._dedicated: dict[int, int] = {}  # device -> claims holding it whole
        self._shared: dict[int, int] = {}  # device -> shares held
        self._dirty = False
        self._inputs: list[cel.DeviceInput | None] = []
        self._expr_results: dict[str, tuple[bytearray, dict[int, str]]] = {}
        self._build(snapshot.allocated_claims, check=snapshot.check_allocated, previous=None)
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
            refused = self._holding_already(claims)
            if refused:
                return Outcome(node=None, allocations=None, reasons=refused)
            outcome, taken = self._allocate(claims, nodes)
            if outcome.allocations is not None:
                for claim, allocation, indices in zip(claims, outcome.allocations, taken, strict=True):
                    self._record(claim, allocation, indices)
            return outcome

    def consider(self, claims: Sequence[model.ResourceClaim]) -> None:
        """Make the request shapes of claims that are expected to come (pending claims) known,
        without allocating. Binpack keeps devices for the shapes it knows: a controller calls
        this with every pending claim, so that its choices depend on what is held and pending,
        not on which claims it happened to see since it started."""
        with self._lock:
            self._refresh()
            for claim in claims:
                self._plan(claim.spec)

    def release(self, claim: str) -> bool:
        """Give back exactly what the claim (`claim_id`) holds: devices, shares, consumed
        capacity and, with the last holder of a device, its counters. False when it held nothing."""
        with self._lock:
            holding = self._holdings.pop(claim, None)
            if holding is None:
                return False
            if not self._dirty:
                self._apply(holding, -1)
            return True

    def hold(self, claim: model.ResourceClaim) -> None:
        """Make the claim hold the allocation it carries, unchecked, as the API's state is the
        truth (an allocation kube-scheduler made, or dractl's own seen again after a restart).
        The same allocation again changes nothing; another one replaces it; a claim without an
        allocation holds nothing afterwards."""
        key = claim_id(claim)
        with self._lock:
            existing = self._holdings.get(key)
            if existing is not None and existing.allocation == claim.allocation:
                return
            self.release(key)
            if claim.allocation is None:
                return
            if self._dirty:
                self._holdings[key] = _Holding(claim, claim.allocation, (), ())
                return
            devices, slots = self._index.takes(claim.allocation)
            holding = self._holdings[key] = _Holding(
                claim, claim.allocation, tuple(devices), tuple(slots), self._held_shapes(claim, claim.allocation)
            )
            self._apply(holding, 1)

    def contested(self, claim: str) -> str | None:
        """Why another claim holds what the claim (`claim_id`) holds, naming that claim, or None (also when the claim
        holds nothing): a device both hold where either holds it whole (shares of a device that allows several
        allocations coexist), or a counter its devices draw that the devices held together overdraw. `hold` enters
        allocations made elsewhere unchecked, as the API's state is the truth; a controller that allocated the claim
        and then held what another scheduler wrote asks here whether the two overlap."""
        with self._lock:
            self._refresh()
            mine = self._holdings.get(claim)
            if mine is None:
                return None
            index = self._index
            for device, shared in mine.devices:
                whole = self._dedicated.get(device, 0) - (0 if shared else 1)
                shares = self._shared.get(device, 0) - (1 if shared else 0)
                if whole > 0 or (shares > 0 and not shared):
                    other = self._holder(claim, device=device)
                    return f"device {index.devices[device].path} is allocated to {other} too"
            for device, _ in mine.devices:
                for k in range(index.cons_off[device], index.cons_off[device + 1]):
                    counter = index.cons_id[k]
                    if self._core.counter_available(counter) < 0:
                        driver, pool, counter_set, name = index.counter_names[counter]
                        return (
                            f"counter {name} of counter set {counter_set} in pool {driver}/{pool}, which device "
                            f"{index.devices[device].path} draws, is overdrawn with "
                            f"{self._holder(claim, counter=counter)}"
                        )
            return None

    def _holder(self, claim: str, *, device: int = -1, counter: int = -1) -> str:
        """The first claim other than `claim` holding `device`, or a device that draws `counter`, as words. Under
        the lock; only called once an overlap was found (it goes over every holding)."""
        index = self._index
        for key, holding in self._holdings.items():
            if key == claim:
                continue
            for used, _ in holding.devices:
                draws = index.cons_id[index.cons_off[used] : index.cons_off[used + 1]]
                if used == device or counter in draws:
                    return f"ResourceClaim {holding.claim.key}"
        return "another claim"

    def held(self, claim: str) -> model.AllocationResult | None:
        """The allocation the claim (`claim_id`) holds, if any."""
        with self._lock:
            holding = self._holdings.get(claim)
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

    # --- the ledger ------------------------------------------------------------------------

    def _holding_already(self, claims: Sequence[model.ResourceClaim]) -> tuple[Reason, ...]:
        seen: set[str] = set()
        reasons: list[Reason] = []
        for claim in claims:
            key = claim_id(claim)
            if key in self._holdings:
                reasons.append(Reason(claim.key, None, "the claim already holds devices; release it first"))
            elif key in seen:
                reasons.append(Reason(claim.key, None, "the claim is listed twice in one allocation"))
            seen.add(key)
        return tuple(reasons)

    def _record(self, claim: model.ResourceClaim, allocation: model.AllocationResult, indices: Sequence[int]) -> None:
        """Enter a committed search result in the ledger: the core already holds it."""
        devices: list[tuple[int, bool]] = []
        slots: list[tuple[int, int, int]] = []
        for index, result in zip(indices, allocation.results, strict=True):
            if result.admin_access:
                continue
            shared = result.share_id is not None
            devices.append((index, shared))
            (self._shared if shared else self._dedicated)[index] = (self._shared if shared else self._dedicated).get(
                index, 0
            ) + 1
            for name, amount in result.consumed_capacity.items():
                slots.append((index, self._index.slot_of[(index, name)], amount.as_int()))
        shapes = self._held_shapes(claim, allocation)
        self._holdings[claim_id(claim)] = _Holding(claim, allocation, tuple(devices), tuple(slots), shapes)
        for shape, count in shapes:
            self._core.add_held(shape, count)

    def _held_shapes(
        self, claim: model.ResourceClaim, allocation: model.AllocationResult
    ) -> tuple[tuple[int, int], ...]:
        """How many devices the allocation holds for each request shape of the claim (results
        with admin access hold nothing), by the (sub)request each result names."""
        plan = self._plan(claim.spec)
        by_name = {alt.name: alt.shape.shape_id for alts in plan.requests for alt in alts}
        counts: dict[int, int] = {}
        for result in allocation.results:
            shape = by_name.get(result.request, -1)
            if shape >= 0 and not result.admin_access:
                counts[shape] = counts.get(shape, 0) + 1
        return tuple(sorted(counts.items()))

    def _apply(self, holding: _Holding, sign: int) -> None:
        """Add (1) or give back (-1) what a holding takes, in the ledger and in the core."""
        for shape, count in holding.shapes:
            self._core.add_held(shape, sign * count)
        for index, shared in holding.devices:
            counts = self._shared if shared else self._dedicated
            left = counts.get(index, 0) + sign
            if left > 0:
                counts[index] = left
            else:
                counts.pop(index, None)
        for index, slot, amount in holding.slots:
            self._core.add_slot_used(index, slot, sign * amount)
        for index in sorted({index for index, _ in holding.devices}):
            self._core.set_held(index, self._dedicated.get(index, 0) > 0, self._shared.get(index, 0))

    def _refresh(self) -> None:
        """Rebuild after a change of inventory, or when the caches outgrow their bounds."""
        if len(self._plans) > _MAX_PLANS:
            self._plans.clear()
            self._plans_by_id.clear()
        if self._dirty or len(self._shapes) > _MAX_SHAPES:
            held = [
                h.claim if h.claim.allocation is h.allocation else dataclasses.replace(h.claim, allocation=h.allocation)
                for h in self._holdings.values()
            ]
            self._build(held, check=False, previous=self._index)

    def _build(
        self, allocated: Sequence[model.ResourceClaim], *, check: bool, previous: _allocindex.Index | None
    ) -> None:
        """The device tables and the core for the current sets, holding `allocated`; selector
        results of unchanged devices carry over from the previous tables."""
        index = _allocindex.Index(slices=self._slices, nodes=self._nodes, allocated=allocated, check=check)
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
            policy=self._policy_code,
        )
        self._carry_over(previous, index)
        self._index = index
        self._node_ids = {name: i for i, name in enumerate(index.node_names) if name is not None}
        self._all_nodes = array.array("i", range(len(index.node_names)))
        self._last_nodes: tuple[tuple[str, ...], array.array[int]] | None = None
        self._class_masks: dict[str, _ClassMask] = {}
        self._expr_keys: dict[str, dict[Hashable, int]] = {}
        self._groups: dict[cel.sharing.Footprint, list[Hashable]] = {}
        self._shapes: dict[object, _Shape] = {}
        self._attrs: dict[str, int] = {}
        self._plans_by_id: dict[int, tuple[model.ResourceClaimSpec, _Plan]] = {}
        self._plans: dict[str, _Plan] = {}
        self._holdings = {}
        self._dedicated = {}
        self._shared = {}
        for claim in allocated:
            if claim.allocation is None or claim.key in index.rejected:
                continue
            devices, slots = index.takes(claim.allocation)
            shapes = self._held_shapes(claim, claim.allocation)
            self._holdings[claim_id(claim)] = _Holding(claim, claim.allocation, tuple(devices), tuple(slots), shapes)
            for device, shared in devices:
                counts = self._shared if shared else self._dedicated
                counts[device] = counts.get(device, 0) + 1
            for shape, count in shapes:
                self._core.add_held(shape, count)
        self._dirty = False

    def _carry_over(self, old: _allocindex.Index | None, index: _allocindex.Index) -> None:
        """Move the per-device caches (CEL inputs, selector results and errors) to the new
        tables' numbering, keeping only devices that are the same object or equal."""
        inputs: list[cel.DeviceInput | None] = [None] * len(index.devices)
        pairs: list[tuple[int, int]] = []
        if old is not None:
            where = {old.identity(i): i for i in range(len(old.devices))}
            for i, ref in enumerate(index.devices):
                j = where.get(index.identity(i))
                if j is not None and (old.devices[j].device is ref.device or old.devices[j].device == ref.device):
                    pairs.append((i, j))
                    inputs[i] = self._inputs[j]
        results: dict[str, tuple[bytearray, dict[int, str]]] = {}
        for expression, (states, errors) in self._expr_results.items():
            moved, moved_errors = bytearray(len(index.devices)), {}
            for i, j in pairs:
                moved[i] = states[j]
                if j in errors:
                    moved_errors[i] = errors[j]
            results[expression] = (moved, moved_errors)
        self._inputs = inputs
        self._expr_results = results

    def _allocate(
        self, claims: Sequence[model.ResourceClaim], nodes: Sequence[str] | None
    ) -> tuple[Outcome, list[list[int]]]:
        """Search and commit in the core; on success also the device index of every result."""
        if not claims:
            return Outcome(node=None, allocations=()), []
        plans = [self._plan(claim.spec) for claim in claims]
        if any(plan.errors for plan in plans):
            reasons = (
                Reason(claim.key, request, message)
                for claim, plan in zip(claims, plans, strict=True)
                for request, message in plan.errors
            )
            return Outcome(node=None, allocations=None, reasons=tuple(reasons)), []
        encoded = plans[0].encoded if len(plans) == 1 else _encode(plans)
        assert encoded is not None
        node_array = None if nodes is None else self._node_array(nodes)
        status, node, alts, devices, requests, stats = self._core.search(
            encoded, node_array, limit=self._limit, commit=True
        )
        if status == _alloc.CEL_ERROR:
            reason = self._cel_error(claims, plans, alt=alts[0], device=devices[0])
            return Outcome(node=None, allocations=None, reasons=(reason,)), []
        if status != _alloc.OK:
            explained = self._explain(claims, plans, status=status, stats=stats, node_array=node_array)
            return Outcome(node=None, allocations=None, reasons=explained), []
        return self._success(claims, plans, node=node, alts=alts, devices=devices, requests=requests)

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

    # --- plans -----------------------------------------------------------------------------

    def _plan(self, spec: model.ResourceClaimSpec) -> _Plan:
        """The compiled plan of a claim spec; cached by identity, then by value."""
        hit = self._plans_by_id.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        key = repr(spec)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._compile(spec)
        self._plans_by_id[id(spec)] = (spec, plan)
        return plan

    def _compile(self, spec: model.ResourceClaimSpec) -> _Plan:
        """Shapes for every request and subrequest, constraint memberships, and every
        reason the claim cannot be allocated anywhere (unknown class, CEL errors, limits,
        malformed constraints). Pure apart from the caches it fills."""
        errors: list[tuple[str | None, str]] = []
        requests: list[list[_Alt]] = []
        minimum = 0
        for request in spec.requests:
            alts: list[_Alt] = []
            if request.exactly is not None:
                e = request.exactly
                alts.append(self._alt(request.name, request.name, e, admin=bool(e.admin_access)))
            for sub in request.first_available:
                alts.append(self._alt(request.name, f"{request.name}/{sub.name}", sub, admin=False))
            if not alts:
                errors.append((request.name, "the request has neither `exactly` nor `firstAvailable`"))
                continue
            for alt in alts:
                if alt.shape.error is not None:
                    errors.append((alt.name, alt.shape.error))
            minimum += min((0 if alt.all_mode else alt.count) for alt in alts)
            requests.append(alts)
        if minimum > MAX_RESULTS:
            errors.append(
                (
                    None,
                    f"the claim asks for at least {minimum} devices, which exceeds the claim limit of {MAX_RESULTS} "
                    "results; split it into several claims",
                )
            )
        names = {alts[0].request: r for r, alts in enumerate(requests)}
        constraints: list[tuple[int, int, str, list[tuple[int, int]]]] = []
        for i, constraint in enumerate(spec.constraints):
            if constraint.match_attribute is not None:
                kind, attribute, text = (
                    _alloc.MATCH,
                    constraint.match_attribute,
                    f"matchAttribute {constraint.match_attribute}",
                )
            elif constraint.distinct_attribute is not None:
                kind, attribute, text = (
                    _alloc.DISTINCT,
                    constraint.distinct_attribute,
                    f"distinctAttribute {constraint.distinct_attribute}",
                )
            else:
                errors.append((None, f"constraints[{i}] sets neither matchAttribute nor distinctAttribute"))
                continue
            members: list[tuple[int, int]] = []
            for ref in constraint.requests or tuple(names):
                base, _, subrequest = ref.partition("/")
                r = names.get(base)
                if r is None:
                    errors.append((None, f"constraints[{i}] names the request {ref!r}, which the claim does not have"))
                    continue
                matched = [(r, a) for a, alt in enumerate(requests[r]) if not subrequest or alt.name == ref]
                if not matched:
                    errors.append(
                        (None, f"constraints[{i}] names the subrequest {ref!r}, which the claim does not have")
                    )
                members.extend(m for m in matched if m not in members)
            if constraint.requests:
                text += f" over {', '.join(constraint.requests)}"
            constraints.append((kind, self._attribute(attribute), text, members))
        self._demand(requests, constraints)
        plan = _Plan(requests=requests, constraints=constraints, config=spec.config, errors=errors)
        if not errors:
            plan.encoded = _encode([plan])
        return plan

    def _demand(
        self, requests: Sequence[Sequence[_Alt]], constraints: Sequence[tuple[int, int, str, list[tuple[int, int]]]]
    ) -> None:
        """Tell the core how many devices each ExactCount alternative asks for, and the attribute
        of the first matchAttribute constraint over it (binpack keeps room for such requests)."""
        for r, alts in enumerate(requests):
            for a, alt in enumerate(alts):
                # An alternative asking for more devices than a claim may hold is never allocated: keeping room
                # for it would only skew the scores (and its count may not fit the core's 32-bit integers).
                if alt.all_mode or alt.shape.shape_id < 0 or alt.count > MAX_RESULTS:
                    continue
                attribute = next(
                    (attr for kind, attr, _, members in constraints if kind == _alloc.MATCH and (r, a) in members), -1
                )
                if (alt.count, attribute) not in alt.shape.demands:
                    alt.shape.demands.add((alt.count, attribute))
                    self._core.set_demand(alt.shape.shape_id, alt.count, attribute)

    def _alt(
        self, request: str, name: str, spec: model.ExactDeviceRequest | model.DeviceSubRequest, *, admin: bool
    ) -> _Alt:
        """One alternative of a request; its shape is shared by every equal request."""
        capacity = spec.capacity_requests
        key = (
            spec.device_class_name,
            spec.selectors,
            spec.tolerations,
            tuple(sorted((k, v.value) for k, v in capacity.items())),
            admin,
        )
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = self._shape(
                spec.device_class_name,
                selectors=spec.selectors,
                tolerations=spec.tolerations,
                capacity=capacity,
                admin=admin,
            )
        all_mode = spec.allocation_mode is model.AllocationMode.ALL
        return _Alt(
            request,
            name,
            spec.device_class_name,
            shape,
            all_mode,
            0 if all_mode else spec.count,
            admin,
            spec.tolerations,
        )

    def _input(self, index: int) -> cel.DeviceInput:
        found = self._inputs[index]
        if found is None:
            ref = self._index.devices[index]
            found = self._inputs[index] = cel.device_input(ref.driver, ref.device)
        return found

    def _evaluate(self, expression: str, mask: bytearray) -> tuple[bytearray, dict[int, str]]:
        """`mask` AND the expression, evaluated where `mask` is set, and the runtime error
        of every device where it failed (those are not in the result). Results are cached
        per (expression, device) and shared between devices the expression cannot tell
        apart (`cel.sharing`); every device still gets its own result or error."""
        program = cel.compile(expression)
        results, errors = self._expr_results.setdefault(expression, (bytearray(len(self._inputs)), {}))
        representatives = self._expr_keys.setdefault(expression, {})
        footprint = cel.sharing.footprint(program.expression)
        keys = None if footprint is None else self._sharing_keys(footprint)
        out = bytearray(len(mask))
        failed: dict[int, str] = {}
        for i, wanted in enumerate(mask):
            if not wanted:
                continue
            state = results[i]
            if state == _UNKNOWN:
                source = -1 if keys is None else representatives.setdefault(keys[i], i)
                if source >= 0 and source != i and results[source] != _UNKNOWN:
                    state = results[source]
                    if state == _FAILED:
                        errors[i] = errors[source]
                else:
                    try:
                        state = _MATCH if program.matches(self._input(i)) else _NO_MATCH
                    except cel.EvalError as failure:
                        state = _FAILED
                        errors[i] = failure.message
                results[i] = state
            if state == _MATCH:
                out[i] = 1
            elif state == _FAILED:
                failed[i] = errors[i]
        return out, failed

    def _sharing_keys(self, footprint: cel.sharing.Footprint) -> list[Hashable]:
        """Per device, its key under `footprint`: equal keys, equal results."""
        found = self._groups.get(footprint)
        if found is None:
            found = self._groups[footprint] = footprint.keys((ref.driver, ref.device) for ref in self._index.devices)
        return found

    def _selectors(
        self, selectors: Sequence[str], mask: bytearray, *, where: str
    ) -> tuple[bytearray, dict[int, str], str | None]:
        """Evaluate selectors in order, each where the previous ones held (upstream
        short-circuits the same way). Returns the mask, a message per device whose
        evaluation failed (naming `where`, the selector and the device), and the compile
        error that stops the request anywhere."""
        failed: dict[int, str] = {}
        devices = self._index.devices
        for k, expression in enumerate(selectors):
            try:
                mask, errors = self._evaluate(expression, mask)
            except cel.CompileError as bad:
                return mask, failed, f"{where}selectors[{k}]: {bad}"
            for i, message in errors.items():
                failed[i] = (
                    f"{where}selectors[{k}]: CEL expression {cel.quote(expression)} failed on device "
                    f"{devices[i].path}: {message}"
                )
        return mask, failed, None

    def _class_mask(self, class_name: str) -> _ClassMask:
        found = self._class_masks.get(class_name)
        if found is None:
            mask, failed, error = self._selectors(
                self._classes[class_name].selectors,
                bytearray(b"\x01" * len(self._inputs)),
                where=f"device class {class_name}: ",
            )
            found = self._class_masks[class_name] = _ClassMask(mask, failed, error, sum(mask))
        return found

    def _shape(
        self,
        class_name: str,
        *,
        selectors: tuple[str, ...],
        tolerations: tuple[model.DeviceToleration, ...],
        capacity: Mapping[str, model.quantity.Quantity],
        admin: bool,
    ) -> _Shape:
        shape = _Shape()
        if not class_name:
            shape.error = "the request names no device class (deviceClassName is empty)"
            return shape
        if class_name not in self._classes:
            shape.error = (
                f"device class {class_name} does not exist; create it or name one of: "
                f"{', '.join(sorted(self._classes)) or '(none defined)'}"
            )
            return shape
        found = self._class_mask(class_name)
        shape.class_matches = found.matches
        if found.error is not None:
            shape.error = found.error
            return shape
        # The class mask is shared by every shape of the class, so it is copied.
        mask, failed, error = self._selectors(selectors, bytearray(found.mask), where="")
        if error is not None:
            shape.error = error
            return shape
        shape.failed = {**found.failed, **failed}
        shape.selected = sum(mask)
        devices = self._index.devices
        cap_entries: dict[int, list[tuple[int, int]]] = {}
        for i, wanted in enumerate(mask):
            if not wanted:
                continue
            device = devices[i].device
            if not capacity and not (device.allow_multiple_allocations and device.capacity):
                continue
            consumed = self._consumption(i, device, requested=capacity)
            if consumed is None:
                mask[i] = 0
                continue
            if device.allow_multiple_allocations:
                shape.consumed[i] = consumed
                if not admin:
                    cap_entries[i] = [
                        (self._index.slot_of[(i, name)], amount.as_int()) for name, amount in consumed.items()
                    ]
        shape.fitting = sum(mask)
        # Mode All takes every selectable device with the capacity, tainted or not (then
        # fails on the taint); the candidates of every other request exclude tainted ones.
        selectable = bytes(mask)
        for i, wanted in enumerate(mask):
            if wanted and devices[i].device.taints and not _tolerated(devices[i].device.taints, tolerations):
                mask[i] = 0
        shape.candidates = sum(mask)
        err = None
        if shape.failed:
            err = bytearray(len(mask))
            for i in shape.failed:
                err[i] = 1
        if cap_entries:
            off, slots, amounts = array.array("i", [0]), array.array("i"), array.array("q")
            for i in range(len(mask)):
                for slot, amount in cap_entries.get(i, ()):
                    slots.append(slot)
                    amounts.append(amount)
                off.append(len(slots))
            shape.shape_id = self._core.add_shape(bytes(mask), selectable, off, slots, amounts, err=err)
        else:
            shape.shape_id = self._core.add_shape(bytes(mask), selectable, err=err)
        return shape

    def _cel_error(
        self, claims: Sequence[model.ResourceClaim], plans: Sequence[_Plan], *, alt: int, device: int
    ) -> Reason:
        """The reason for a search that met a device whose selector failed: the claim and
        (sub)request of core alternative `alt`, quoting the expression and the device."""
        for claim, plan in zip(claims, plans, strict=True):
            for options in plan.requests:
                if alt < len(options):
                    return Reason(claim.key, options[alt].name, options[alt].shape.failed[device])
                alt -= len(options)
        raise AssertionError("the core named an alternative outside the plan")

    def _consumption(
        self, index: int, device: model.Device, *, requested: Mapping[str, model.quantity.Quantity]
    ) -> dict[str, model.quantity.Quantity] | None:
        """What one allocation would consume of each capacity, or None when the device
        lacks a requested capacity, its policy refuses the amount, or (for a dedicated
        device) it cannot hold the amount."""
        if any(name not in device.capacity for name in requested):
            return None
        consumed: dict[str, model.quantity.Quantity] = {}
        names = device.capacity if device.allow_multiple_allocations else requested
        for name in names:
            entry = device.capacity[name]
            amount = _capacity_amount(entry, requested.get(name))
            if amount is None:
                return None
            # Only what can never fit is left out: current usage changes with every commit
            # and release, and the core checks it at allocation time.
            if amount.as_int() > entry.value.as_int():
                return None
            consumed[name] = amount
        return consumed

    def _attribute(self, qualified: str) -> int:
        """Register a constraint attribute: per device the interned ids of its values
        (a scalar is a one-element set; versions compare by their text)."""
        found = self._attrs.get(qualified)
        if found is not None:
            return found
        ids: dict[tuple[str, object], int] = {}
        # Decoded devices share equal attribute values: each value object is interned once.
        interned: dict[int, list[int]] = {}  # id of an attribute (alive in the index) -> its value ids
        off, vals = array.array("i", [0]), array.array("i")
        for ref in self._index.devices:
            attribute = _allocindex.lookup_attribute(ref, qualified)
            if attribute is not None:
                value_ids = interned.get(id(attribute))
                if value_ids is None:
                    value_ids = interned[id(attribute)] = []
                    texts = attribute.texts or tuple(str(v) for v in attribute.values)
                    for value, text in zip(attribute.values, texts, strict=True):
                        key = (attribute.kind.value, text if attribute.kind is model.AttributeKind.VERSION else value)
                        vid = ids.setdefault(key, len(ids))
                        if vid not in value_ids:
                            value_ids.append(vid)
                vals.extend(value_ids)
            off.append(len(vals))
        attr_id: int = self._core.add_attribute(off, vals, len(ids))
        self._attrs[qualified] = attr_id
        return attr_id

    # --- results ---------------------------------------------------------------------------

    def _success(
        self,
        claims: Sequence[model.ResourceClaim],
        plans: Sequence[_Plan],
        *,
        node: int,
        alts: Sequence[int],
        devices: Sequence[int],
        requests: Sequence[int],
    ) -> tuple[Outcome, list[list[int]]]:
        """The allocations the core found, and per claim the device index of every result."""
        node_name = self._index.node_names[node]
        refs = self._index.devices
        allocations: list[model.AllocationResult] = []
        taken: list[list[int]] = []
        alt_base = 0
        req_base = 0
        position = 0
        usable_everywhere = True
        for claim, plan in zip(claims, plans, strict=True):
            n_req = len(plan.requests)
            chosen: list[int] = []
            flat: list[_Alt] = []
            offset = alt_base
            for r, options in enumerate(plan.requests):
                chosen.append(alts[req_base + r] - offset)
                offset += len(options)
                flat.append(options[chosen[-1]])
            results: list[model.DeviceRequestAllocationResult] = []
            claim_refs: list[_allocindex.DeviceRef] = []
            while position < len(devices) and requests[position] < req_base + n_req:
                ref = refs[devices[position]]
                results.append(self._result(claim, flat[requests[position] - req_base], ref=ref, position=len(results)))
                claim_refs.append(ref)
                position += 1
            taken.append([ref.index for ref in claim_refs])
            selector = _node_selector(claim_refs, node_name)
            if selector is not None:
                usable_everywhere = False
            allocations.append(
                model.AllocationResult(
                    results=tuple(results),
                    config=self._config(plan, chosen=tuple(chosen), flat=flat),
                    node_selector=selector,
                )
            )
            alt_base = offset
            req_base += n_req
        return Outcome(node=None if usable_everywhere else node_name, allocations=tuple(allocations)), taken

    def _result(
        self, claim: model.ResourceClaim, alt: _Alt, *, ref: _allocindex.DeviceRef, position: int
    ) -> model.DeviceRequestAllocationResult:
        device = ref.device
        shared = device.allow_multiple_allocations
        return model.DeviceRequestAllocationResult(
            request=alt.name,
            driver=ref.driver,
            pool=ref.pool,
            device=device.name,
            admin_access=True if alt.admin else None,
            tolerations=alt.tolerations,
            binding_conditions=device.binding_conditions,
            binding_failure_conditions=device.binding_failure_conditions,
            share_id=str(uuid.uuid5(_SHARE_NAMESPACE, f"{claim.key}\x00{alt.name}\x00{ref.path}\x00{position}"))
            if shared
            else None,
            consumed_capacity=dict(alt.shape.consumed.get(ref.index, {})) if shared else {},
        )

    def _config(
        self, plan: _Plan, *, chosen: tuple[int, ...], flat: Sequence[_Alt]
    ) -> tuple[model.DeviceAllocationConfiguration, ...]:
        """Class configs (each class once, listing its requests), then claim configs that
        name something allocated; `requests` is cleared when it covers every request."""
        found = plan.configs.get(chosen)
        if found is not None:
            return found
        top = [alt.request for alt in flat]
        selected = {alt.name for alt in flat}
        entries: list[model.DeviceAllocationConfiguration] = []
        by_class: dict[str, list[str]] = {}
        for alt in flat:
            by_class.setdefault(alt.class_name, []).append(alt.name)
        for class_name, names in by_class.items():
            for opaque in self._classes[class_name].config:
                entries.append(
                    model.DeviceAllocationConfiguration(
                        source="FromClass", requests=_scope(names, top=top, selected=selected), opaque=opaque
                    )
                )
        for claim_config in plan.config:
            if claim_config.requests and not any(ref in top or ref in selected for ref in claim_config.requests):
                continue
            entries.append(
                model.DeviceAllocationConfiguration(
                    source="FromClaim",
                    requests=_scope(list(claim_config.requests), top=top, selected=selected),
                    opaque=claim_config.opaque,
                )
            )
        result = plan.configs[chosen] = tuple(entries)
        return result

    # --- reasons ---------------------------------------------------------------------------

    def _explain(
        self,
        claims: Sequence[model.ResourceClaim],
        plans: Sequence[_Plan],
        *,
        status: int,
        stats: Sequence[Sequence[int]],
        node_array: array.array[int] | None,
    ) -> tuple[Reason, ...]:
        reasons: list[Reason] = []
        first = claims[0].key
        if node_array is not None and not node_array:
            reasons.append(
                Reason(first, None, "none of the candidate nodes is known (no Node object or ResourceSlice names them)")
            )
        if status == _alloc.SEARCH_LIMIT:
            reasons.append(
                Reason(
                    first,
                    None,
                    f"search limit reached after {self._limit} steps without finding an allocation; the claims' "
                    "constraints are too hard to satisfy together (raise the search limit or simplify the constraints)",
                )
            )
        nodes = node_array if node_array is not None else self._all_nodes
        # Requests are explained when something is known to stop them (too few free
        # devices, a counter, capacity or constraint refusal, the claim limit); when none
        # is, every request is explained and the claim-level reason says they only fail
        # together.
        explained: list[tuple[bool, Reason]] = []
        alt_index = 0
        # The core numbers constraints across all claims of the call, in claim order.
        constraint_base = 0
        for claim, plan in zip(claims, plans, strict=True):
            for options in plan.requests:
                rows = [
                    self._alt_message(
                        alt, row=stats[alt_index + i], plan=plan, constraint_base=constraint_base, nodes=nodes
                    )
                    for i, alt in enumerate(options)
                ]
                alt_index += len(options)
                blamed = any(b for b, _ in rows)
                explained.extend(
                    (blamed, Reason(claim.key, alt.name, message))
                    for alt, (_, message) in zip(options, rows, strict=True)
                )
            constraint_base += len(plan.constraints)
        if any(blamed for blamed, _ in explained):
            reasons.extend(reason for blamed, reason in explained if blamed)
        else:
            reasons.extend(reason for _, reason in explained)
            if status != _alloc.SEARCH_LIMIT and nodes:
                reasons.append(
                    Reason(
                        first,
                        None,
                        f"every request has devices on its own, but none of the {len(nodes)} candidate "
                        f"node{_s(len(nodes))} has devices for all requests together",
                    )
                )
        for problem in self._index.problems(node_array):
            reasons.append(Reason(first, None, problem.message()))
        return tuple(reasons)

    def _alt_message(
        self, alt: _Alt, *, row: Sequence[int], plan: _Plan, constraint_base: int, nodes: array.array[int]
    ) -> tuple[bool, str]:
        """The reason text for one alternative, and whether it is known to stop the claim."""
        shape = alt.shape
        free = self._core.count_free(shape.shape_id, admin=alt.admin, nodes=nodes)
        parts = [f"device class {alt.class_name} matches {shape.class_matches} device{_s(shape.class_matches)}"]
        parts.append(f"{shape.selected} pass the request's selectors")
        if shape.fitting != shape.selected:
            parts.append(f"{shape.selected - shape.fitting} of those lack the requested capacity")
        if shape.candidates != shape.fitting:
            parts.append(f"{shape.fitting - shape.candidates} of those have a taint the request does not tolerate")
        need = "all of them" if alt.all_mode else f"{alt.count} needed"
        parts.append(f"{free} of those are free on the candidate nodes ({need})")
        if row[_alloc.STAT_COUNTER]:
            driver, pool, counter_set, counter = self._index.counter_names[row[_alloc.STAT_LAST_COUNTER]]
            parts.append(f"counter {counter} of counter set {counter_set} in pool {driver}/{pool} ran out")
        if row[_alloc.STAT_CAPACITY]:
            d, name = self._index.slot_names[row[_alloc.STAT_LAST_SLOT]]
            parts.append(f"capacity {name} of device {self._index.devices[d].path} ran out")
        if row[_alloc.STAT_CONSTRAINT]:
            parts.append(
                f"constraint {plan.constraints[row[_alloc.STAT_LAST_CONSTRAINT] - constraint_base][2]} could not be met"
            )
        if row[_alloc.STAT_ALL_BLOCKED]:
            parts.append(
                "allocationMode All needs every matching device, but some are already allocated or have a taint the "
                "request does not tolerate"
            )
        if row[_alloc.STAT_BAD_POOL]:
            parts.append("allocationMode All cannot be used on nodes with an invalid or incomplete pool")
        if row[_alloc.STAT_SIZE]:
            parts.append(f"taking them all exceeds the claim limit of {MAX_RESULTS} results")
        refused = any(
            row[k]
            for k in (
                _alloc.STAT_SHORT,
                _alloc.STAT_COUNTER,
                _alloc.STAT_CAPACITY,
                _alloc.STAT_CONSTRAINT,
                _alloc.STAT_ALL_BLOCKED,
                _alloc.STAT_BAD_POOL,
                _alloc.STAT_SIZE,
            )
        )
        return refused or free < max(alt.count, 1), "; ".join(parts)


# --- helpers -------------------------------------------------------------------------------


def _encode(plans: Sequence[_Plan]) -> array.array[int]:
    """The core's plan layout: header, then per-claim, per-request and per-alternative
    tables, constraint memberships and constraints (see `_alloc.Core.search`)."""
    claim_req_off, req_alt_off = [0], [0]
    alt_shape: list[int] = []
    alt_mode: list[int] = []
    alt_count: list[int] = []
    alt_admin: list[int] = []
    alt_mem_off: list[int] = [0]
    mem_cons: list[int] = []
    cons_kind: list[int] = []
    cons_attr: list[int] = []
    for plan in plans:
        base_req = len(req_alt_off) - 1
        base_cons = len(cons_kind)
        membership: dict[tuple[int, int], list[int]] = {}
        for k, (kind, attr, _, members) in enumerate(plan.constraints):
            cons_kind.append(kind)
            cons_attr.append(attr)
            for member in members:
                membership.setdefault(member, []).append(base_cons + k)
        for r, options in enumerate(plan.requests):
            for a, alt in enumerate(options):
                alt_shape.append(alt.shape.shape_id)
                alt_mode.append(_alloc.MODE_ALL if alt.all_mode else _alloc.MODE_EXACT)
                # Beyond the claim limit every count fails alike; capped, it fits the core's 32-bit integers.
                alt_count.append(min(alt.count, MAX_RESULTS + 1))
                alt_admin.append(1 if alt.admin else 0)
                mem_cons.extend(membership.get((r, a), ()))
                alt_mem_off.append(len(mem_cons))
            req_alt_off.append(len(alt_shape))
        claim_req_off.append(base_req + len(plan.requests))
    header = [len(plans), len(req_alt_off) - 1, len(alt_shape), len(cons_kind), len(mem_cons)]
    return array.array(
        "i",
        header
        + claim_req_off
        + req_alt_off
        + alt_shape
        + alt_mode
        + alt_count
        + alt_admin
        + alt_mem_off
        + mem_cons
        + cons_kind
        + cons_attr,
    )


def _scope(names: list[str], *, top: list[str], selected: set[str]) -> tuple[str, ...]:
    """A config's `requests`: empty when the names cover every request of the claim."""
    covered = {n.partition("/")[0] for n in names if "/" not in n or n in selected}
    if all(t in covered for t in top):
        return ()
    return tuple(names)


def _tolerated(taints: Sequence[model.DeviceTaint], tolerations: Sequence[model.DeviceToleration]) -> bool:
    return all(t.effect not in _BLOCKING_EFFECTS or any(_tolerates(tol, t) for tol in tolerations) for t in taints)


def _tolerates(toleration: model.DeviceToleration, taint: model.DeviceTaint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    if toleration.operator in ("Equal", ""):
        return toleration.value == taint.value
    return False


def _capacity_amount(
    entry: model.DeviceCapacity, requested: model.quantity.Quantity | None
) -> model.quantity.Quantity | None:
    """The amount one allocation consumes under the capacity's request policy, or None
    when the policy refuses it. Integer arithmetic, like `Quantity.Value()`."""
    policy = entry.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return entry.value
    if policy is None:
        return requested
    amount = requested.as_int()
    result: model.quantity.Quantity = requested
    if policy.valid_range is not None:
        low = policy.valid_range.min.as_int()
        if amount < low:
            result = policy.valid_range.min
        elif policy.valid_range.step is not None:
            step = policy.valid_range.step.as_int()
            if step > 0 and (amount - low) % step:
                result = model.quantity.from_int(low + -(-(amount - low) // step) * step)
        if (
            policy.valid_range.max is not None
            and result.as_int() > policy.valid_range.max.as_int()
            and result != policy.default
        ):
            return None
    elif policy.valid_values:
        bigger = [v for v in policy.valid_values if v.as_int() >= amount]
        if bigger:
            result = min(bigger, key=lambda v: v.as_int())
        if result not in policy.valid_values and result != policy.default:
            return None
    return result


def _node_selector(refs: Sequence[_allocindex.DeviceRef], node: str | None) -> model.NodeSelector | None:
    """Where the allocation is usable: the node itself when any device is node-local,
    else the AND of the devices' selectors as one term, else None (everywhere)."""
    if node is not None:
        for ref in refs:
            if ref.node_local:
                return _name_selector(node)
    selectors: list[model.NodeSelector] = []
    for ref in refs:
        if ref.node_selector is not None and ref.node_selector not in selectors:
            selectors.append(ref.node_selector)
    if not selectors:
        return None
    if len(selectors) == 1:
        return selectors[0]
    if any(len(s.terms) != 1 for s in selectors):
        # Several multi-term selectors have no single-term AND; the node itself is exact.
        return _name_selector(node) if node is not None else selectors[0]
    expressions: list[model.NodeSelectorRequirement] = []
    fields: list[model.NodeSelectorRequirement] = []
    for s in selectors:
        for requirement in s.terms[0].match_expressions:
            if not any(_same_requirement(requirement, r) for r in expressions):
                expressions.append(requirement)
        for requirement in s.terms[0].match_fields:
            if not any(_same_requirement(requirement, r) for r in fields):
                fields.append(requirement)
    return model.NodeSelector(
        terms=(model.NodeSelectorTerm(match_expressions=tuple(expressions), match_fields=tuple(fields)),)
    )


def _same_requirement(a: model.NodeSelectorRequirement, b: model.NodeSelectorRequirement) -> bool:
    return a.key == b.key and a.operator == b.operator and set(a.values) == set(b.values)


@functools.lru_cache(maxsize=65536)
def _name_selector(node: str) -> model.NodeSelector:
    return model.NodeSelector(
        terms=(
            model.NodeSelectorTerm(
                match_fields=(model.NodeSelectorRequirement(key=_allocindex.NAME_FIELD, operator="In", values=(node,)),)
            ),
        )
    )


def _s(n: int) -> str:
    return "" if n == 1 else "s"
