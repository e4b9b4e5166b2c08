"""A brute-force allocation oracle for the allocator's property tests (small instances only).

What it does: `check(snapshot, claims, node, allocations)` lists every rule of DESIGN.md and
k8s-dra-core.md section 3 that a joint allocation of `claims` on `node` breaks, and
`find_allocation(snapshot, claims, node)` enumerates every assignment of devices to request
slots (every subrequest choice, every combination of devices) and returns the first one that
`check` accepts, or None when none exists. The search only prunes a partial assignment when
`check` already rejects it and every rule is monotone (adding a device never repairs a broken
rule), so it is exhaustive.

What it must not do: share code with `dractl/alloc/` or `dractl/_alloc.pyx`. It uses the model
types and `dractl.cel` (selector evaluation) only, so it cannot inherit an allocator bug. It is
written to be obviously correct, not fast: keep instances to about eight devices per node.

Semantics where dractl is deliberately more correct than upstream (DESIGN.md, numbered as there):
(1) the search is complete; (2) `distinctAttribute` is pairwise over every device of the
constraint; (3) counters are checked per counter set the device consumes (every counter of such
a set, counting every allocated device of the pool); (4) list-type `matchAttribute` needs a
non-empty intersection over the devices actually chosen; (5) counters are kept per (driver,
pool); (6) adminAccess requests neither need nor consume counters.

One choice where upstream gives no usable answer: upstream prepares every All-mode (sub)request
before searching and aborts the claim when the node has an incomplete or invalid pool, even
when that subrequest would never be chosen. Here an All-mode alternative simply cannot be
satisfied on such a node, and a `firstAvailable` request moves on to its next subrequest.

CEL runtime errors follow upstream's lazy evaluation (k8s-dra-core.md 2 and 3.4): selectors are
evaluated when the search tries a device, after the in-use check, so a device that matches
before the search reaches a failing one wins, and the search raises `CelError` where it first
tries a free failing device; All-mode sets are collected (every visible device, in use or not)
for every claim, request and subrequest before the search starts. Every device is evaluated on
its own (no result is shared between devices), so the allocator's sharing cannot leak in.

Not modelled (the strategies never generate them): invalid pools reachable only through malformed slices (handled, but
not generated on purpose), adminAccess on a device with allowMultipleAllocations, configuration in results.
"""

from __future__ import annotations

import dataclasses
import fractions
import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

from dractl import alloc, model

Fraction = fractions.Fraction

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_NAME_FIELD = "metadata.name"


class OracleError(Exception):
    """The instance is outside what the oracle decides."""


class CelError(Exception):
    """The search met a device whose selector fails at run time: upstream's answer is this
    error. `ref` is the device, `expression` the selector that failed."""

    def __init__(self, ref: Ref, expression: str, message: str) -> None:
        super().__init__(f"CEL {expression!r} on {ref}: {message}")
        self.ref = ref
        self.expression = expression
        self.message = message


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class Ref:
    """A device by (driver, pool, device): the identity the API uses in results."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclasses.dataclass(frozen=True, slots=True)
class Spec:
    """One request or one subrequest of a claim, as allocation sees it.

    `request` is the top-level request name, `name` what results carry ("req" or "req/sub").
    """

    request: str
    name: str
    class_name: str
    selectors: tuple[str, ...]
    all_mode: bool
    count: int
    admin: bool
    tolerations: tuple[model.DeviceToleration, ...]
    capacity_requests: tuple[tuple[str, model.quantity.Quantity], ...]


def specs_of(request: model.DeviceRequest) -> tuple[Spec, ...]:
    """The alternatives of a request in priority order: one for `exactly`, one per subrequest."""
    if request.exactly is not None:
        e = request.exactly
        return (
            Spec(
                request=request.name,
                name=request.name,
                class_name=e.device_class_name,
                selectors=e.selectors,
                all_mode=e.allocation_mode is model.AllocationMode.ALL,
                count=e.count,
                admin=bool(e.admin_access),
                tolerations=e.tolerations,
                capacity_requests=tuple(sorted(e.capacity_requests.items())),
            ),
        )
    return tuple(
        Spec(
            request=request.name,
            name=f"{request.name}/{sub.name}",
            class_name=sub.device_class_name,
            selectors=sub.selectors,
            all_mode=sub.allocation_mode is model.AllocationMode.ALL,
            count=sub.count,
            admin=False,
            tolerations=sub.tolerations,
            capacity_requests=tuple(sorted(sub.capacity_requests.items())),
        )
        for sub in request.first_available
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """A device of the current generation of a pool, with the slice that publishes it."""

    ref: Ref
    device: model.Device
    slice: model.ResourceSlice
    order: tuple[str, str, str, int]  # upstream's search order: driver, pool, slice name, index


@dataclasses.dataclass(slots=True)
class _Pool:
    driver: str
    name: str
    complete: bool
    problem: str = ""  # why the pool is unusable ("incomplete", "invalid: ...")
    devices: dict[str, Entry] = dataclasses.field(default_factory=dict)  # every slice at the generation
    counter_sets: dict[str, dict[str, Fraction]] = dataclasses.field(default_factory=dict)


# --- Small pure helpers -----------------------------------------------------------------------


def requirement_matches(req: model.NodeSelectorRequirement, value: str | None) -> bool:
    """One node-selector requirement against a label (or field) value; None means absent."""
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, want = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def selector_matches(selector: model.NodeSelector, node: str, labels: Mapping[str, str]) -> bool:
    """core/v1 NodeSelector semantics: terms ORed, requirements ANDed, an empty term matches nothing."""
    for term in selector.terms:
        if not term.match_expressions and not term.match_fields:
            continue
        exprs = all(requirement_matches(r, labels.get(r.key)) for r in term.match_expressions)
        fields = all(requirement_matches(r, node if r.key == _NAME_FIELD else None) for r in term.match_fields)
        if exprs and fields:
            return True
    return False


def toleration_matches(tol: model.DeviceToleration, taint: model.DeviceTaint) -> bool:
    """resourceclaim/devicetoleration.go: effect and key empty or equal; Equal needs the value."""
    if tol.effect and tol.effect != taint.effect:
        return False
    if tol.key and tol.key != taint.key:
        return False
    if tol.operator in ("Equal", ""):
        return tol.value == taint.value
    return tol.operator == "Exists"


def untolerated_taints(spec: Spec, device: model.Device) -> list[model.DeviceTaint]:
    """NoSchedule/NoExecute taints that no toleration of the (sub)request tolerates."""
    return [
        t
        for t in device.taints
        if t.effect in _BLOCKING_EFFECTS and not any(toleration_matches(tol, t) for tol in spec.tolerations)
    ]


def attribute_values(entry: Entry, name: str) -> frozenset[tuple[str, object]] | None:
    """The values of a fully qualified attribute as a set of (kind, value), None when absent.

    A bare attribute name belongs to the driver's domain. Versions compare by their spelling,
    as upstream does in constraints; the kind is part of the value so 1 and "1" and True differ.
    """
    attrs = entry.device.attributes
    attr = attrs.get(name)
    if attr is None and "/" in name:
        domain, _, ident = name.partition("/")
        if domain == entry.ref.driver:
            attr = attrs.get(ident)
    if attr is None or not attr.values:
        return None
    if attr.kind is model.AttributeKind.VERSION:
        texts = attr.texts or tuple(str(v) for v in attr.values)
        return frozenset(("version", t) for t in texts)
    return frozenset((attr.kind.value, v) for v in attr.values)


def _q(value: model.quantity.Quantity) -> Fraction:
    return value.value


def consumed_amount(capacity: model.DeviceCapacity, requested: model.quantity.Quantity | None) -> tuple[Fraction, str]:
    """How much of one capacity a share consumes, and a policy violation ("" when none).

    Not requested: the policy default, else the full value. Requested: validRange rounds up to
    min and then to a step multiple above min; validValues rounds up to the smallest valid
    value (or stays put when none is large enough). A value equal to the default always passes.
    """
    policy = capacity.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            amount = _q(policy.default)
        else:
            amount = _q(capacity.value)
    else:
        amount = _q(requested)
        if policy is not None and policy.valid_values:
            bigger = [_q(v) for v in policy.valid_values if _q(v) >= amount]
            if bigger:
                amount = min(bigger)
        elif policy is not None and policy.valid_range is not None:
            rng = policy.valid_range
            low = _q(rng.min)
            if amount < low:
                amount = low
            elif rng.step is not None and _q(rng.step) > 0:
                step = _q(rng.step)
                steps = -((low - amount) // step)  # ceiling division on fractions
                amount = low + steps * step
    if policy is None or (policy.default is not None and amount == _q(policy.default)):
        return amount, ""
    if policy.valid_values and amount not in {_q(v) for v in policy.valid_values}:
        return amount, f"{amount} is not one of validValues"
    if policy.valid_range is not None:
        rng = policy.valid_range
        if amount < _q(rng.min):
            return amount, f"{amount} is below validRange.min"
        if rng.max is not None and amount > _q(rng.max):
            return amount, f"{amount} exceeds validRange.max {rng.max}"
        if rng.step is not None and _q(rng.step) > 0 and (amount - _q(rng.min)) % _q(rng.step) != 0:
            return amount, f"{amount} is not a step multiple above validRange.min"
    return amount, ""


def _quantity(amount: Fraction) -> model.quantity.Quantity:
    if amount.denominator == 1:
        return model.quantity.Quantity(value=amount, text=model.quantity.format_bytes(int(amount)))
    return model.quantity.Quantity(value=amount, text=str(float(amount)))


def _selector_key(
    selector: model.NodeSelector,
) -> tuple[frozenset[tuple[str, str, frozenset[str]]], frozenset[tuple[str, str, frozenset[str]]]] | str:
    if len(selector.terms) != 1:
        return f"{len(selector.terms)} terms"
    term = selector.terms[0]
    return (
        frozenset((r.key, r.operator, frozenset(r.values)) for r in term.match_expressions),
        frozenset((r.key, r.operator, frozenset(r.values)) for r in term.match_fields),
    )


# --- The oracle -------------------------------------------------------------------------------


class Oracle:
    """Everything the rules need about one snapshot seen from one node, computed once.

    Pure with respect to its inputs; caches CEL results per (expression, device).
    """

    def __init__(self, snapshot: alloc.Snapshot, node: str) -> None:
        self.snapshot = snapshot
        self.node = node
        self.labels: Mapping[str, str] = next((n.meta.labels for n in snapshot.nodes if n.meta.name == node), {})
        self.classes = {c.meta.name: c for c in snapshot.device_classes}
        self.pools: dict[tuple[str, str], _Pool] = {}
        self.visible: dict[Ref, Entry] = {}
        self._gather_pools()
        self.order = sorted(self.visible, key=lambda ref: self.visible[ref].order)
        self.broken = sorted(f"{d}/{p} ({pool.problem})" for (d, p), pool in self.pools.items() if pool.problem)
        self._gather_allocated()
        self._match_cache: dict[tuple[str, Ref], bool] = {}
        self._inputs: dict[Ref, object] = {}
        self._static_cache: dict[tuple[Spec, Ref], list[str]] = {}
        self._all_cache: dict[Spec, list[Ref]] = {}

    # Node visibility and pools (k8s-dra-core.md 3.2).

    def _own_binding(self, obj: model.ResourceSlice | model.Device) -> bool | None:
        """Whether `obj`'s nodeName, allNodes or nodeSelector (the first set) selects this node; None if none is set."""
        if obj.node_name is not None:
            return obj.node_name == self.node
        if obj.all_nodes:
            return True
        if obj.node_selector is not None:
            return selector_matches(obj.node_selector, self.node, self.labels)
        return None

    def _slice_relevant(self, s: model.ResourceSlice) -> bool:
        own = self._own_binding(s)
        if own is not None:
            return own
        return s.per_device_node_selection and any(self._device_targets(s, d) for d in s.devices)

    def _device_targets(self, s: model.ResourceSlice, d: model.Device) -> bool:
        if not s.per_device_node_selection:
            return self._slice_relevant(s)
        return self._own_binding(d) is True

    def _gather_pools(self) -> None:
        everything = list(self.snapshot.resource_slices)
        relevant: dict[tuple[str, str], list[model.ResourceSlice]] = defaultdict(list)
        for s in everything:
            if self._slice_relevant(s):
                relevant[(s.driver, s.pool.name)].append(s)
        for key, slices in relevant.items():
            generation = max(s.pool.generation for s in slices)
            kept = [s for s in slices if s.pool.generation == generation]
            count = kept[0].pool.resource_slice_count
            members = kept
            if len(kept) != count:
                cluster = [s for s in everything if (s.driver, s.pool.name) == key]
                if any(s.pool.generation > generation for s in cluster):
                    continue  # obsolete: a newer generation is being published elsewhere
                members = [s for s in cluster if s.pool.generation == generation]
                if len(members) != count:
                    self.pools[key] = _Pool(driver=key[0], name=key[1], complete=False, problem="incomplete")
                    continue
            self.pools[key] = self._build_pool(key, members, kept)

    def _build_pool(
        self, key: tuple[str, str], members: list[model.ResourceSlice], kept: list[model.ResourceSlice]
    ) -> _Pool:
        pool = _Pool(driver=key[0], name=key[1], complete=True)
        problems: list[str] = []
        targeting_names: set[str] = set()
        kept_ids = {id(s) for s in kept}
        for s in sorted(members, key=lambda s: s.meta.name):
            for cs in s.shared_counters:
                if cs.name in pool.counter_sets:
                    problems.append(f"duplicate counter set {cs.name}")
                pool.counter_sets[cs.name] = {k: _q(v) for k, v in cs.counters.items()}
            for index, d in enumerate(s.devices):
                ref = Ref(key[0], key[1], d.name)
                entry = Entry(ref=ref, device=d, slice=s, order=(key[0], key[1], s.meta.name, index))
                pool.devices.setdefault(d.name, entry)
                if id(s) in kept_ids and self._device_targets(s, d):
                    if d.name in targeting_names:
                        problems.append(f"duplicate device {d.name}")
                    targeting_names.add(d.name)
        for entry in pool.devices.values():
            for use in entry.device.consumes_counters:
                counters = pool.counter_sets.get(use.counter_set)
                if counters is None:
                    problems.append(f"{entry.ref.device} consumes unknown counter set {use.counter_set}")
                elif set(use.counters) - set(counters):
                    problems.append(f"{entry.ref.device} consumes unknown counters of {use.counter_set}")
        if problems:
            pool.complete = False
            pool.problem = "invalid: " + "; ".join(problems)
            return pool
        for s in kept:
            for index, d in enumerate(s.devices):
                if self._device_targets(s, d):
                    ref = Ref(key[0], key[1], d.name)
                    self.visible[ref] = Entry(ref=ref, device=d, slice=s, order=(key[0], key[1], s.meta.name, index))
        return pool

    def _entry(self, ref: Ref) -> Entry | None:
        """Any device of the pool's current generation (visible or not), for counters."""
        pool = self.pools.get((ref.driver, ref.pool))
        return None if pool is None else pool.devices.get(ref.device)

    # Existing allocations (k8s-dra-core.md 3.1 allocatedState).

    def _gather_allocated(self) -> None:
        self.dedicated: set[Ref] = set()
        self.shared: dict[Ref, int] = defaultdict(int)
        self.aggregated: dict[Ref, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        self.share_ids: set[tuple[Ref, str]] = set()
        for claim in self.snapshot.allocated_claims:
            if claim.allocation is None:
                continue
            for r in claim.allocation.results:
                if r.admin_access:
                    continue  # admin access ignores, and is ignored by, other allocations
                ref = Ref(r.driver, r.pool, r.device)
                if r.share_id is None:
                    self.dedicated.add(ref)
                else:
                    self.shared[ref] += 1
                    self.share_ids.add((ref, r.share_id))
                    for k, v in r.consumed_capacity.items():
                        self.aggregated[ref][k] += _q(v)
        # Counter consumption of every allocated device of each pool, each device once.
        self.base_counters: dict[tuple[str, str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        for ref in self.dedicated | set(self.shared):
            entry = self._entry(ref)
            if entry is not None:
                self._charge(self.base_counters, entry)

    @staticmethod
    def _charge(totals: dict[tuple[str, str, str], dict[str, Fraction]], entry: Entry) -> None:
        for use in entry.device.consumes_counters:
            for k, v in use.counters.items():
                totals[(entry.ref.driver, entry.ref.pool, use.counter_set)][k] += _q(v)

    # Per (request, device) rules.

    def _input(self, entry: Entry) -> object:
        from dractl import cel  # noqa: PLC0415  (the CEL layer is only needed once a selector is evaluated)

        if entry.ref not in self._inputs:
            self._inputs[entry.ref] = cel.device_input(entry.ref.driver, entry.device)
        return self._inputs[entry.ref]

    def _selector_matches(self, expression: str, entry: Entry) -> bool:
        key = (expression, entry.ref)
        if key not in self._match_cache:
            from dractl import cel  # noqa: PLC0415

            try:
                self._match_cache[key] = bool(_program(expression).matches(self._input(entry)))
            except cel.EvalError as err:
                raise CelError(entry.ref, expression, err.message) from err
        return self._match_cache[key]

    def selected(self, spec: Spec, entry: Entry) -> bool:
        """Class selectors, then the (sub)request's selectors, all must be true."""
        cls = self.classes.get(spec.class_name)
        if cls is None:
            return False
        return all(self._selector_matches(e, entry) for e in (*cls.selectors, *spec.selectors))

    def failure(self, spec: Spec, entry: Entry) -> CelError | None:
        """The error evaluating the (sub)request's selectors on the device raises, if any
        (class selectors first, each only while the previous ones held)."""
        if spec.class_name not in self.classes:
            return None
        try:
            self.selected(spec, entry)
        except CelError as error:
            return error
        return None

    def held(
        self, spec: Spec, ref: Ref, claim: int, results: Sequence[Sequence[model.DeviceRequestAllocationResult]]
    ) -> bool:
        """Upstream's in-use check before selectors are evaluated: admin access only refuses a
        dedicated device its own claim already took; otherwise a device another claim holds
        dedicated, or a dedicated device taken earlier in this allocation, is in use."""
        multi = self.visible[ref].device.allow_multiple_allocations
        taken = [i for i, rs in enumerate(results) for r in rs if Ref(r.driver, r.pool, r.device) == ref]
        if spec.admin:
            return not multi and claim in taken
        return ref in self.dedicated or (not multi and bool(taken))

    def share_amounts(self, spec: Spec, entry: Entry) -> tuple[dict[str, Fraction], list[str]]:
        """What one allocation of the device for this (sub)request consumes, and the problems.

        Checked against existing allocations only (not against this allocation's other shares).
        """
        device = entry.device
        problems: list[str] = []
        requested = dict(spec.capacity_requests)
        for name in requested:
            if name not in device.capacity:
                problems.append(f"lacks requested capacity {name}")
        amounts: dict[str, Fraction] = {}
        for name, cap in device.capacity.items():
            want = requested.get(name)
            if device.allow_multiple_allocations:
                amount, violation = consumed_amount(cap, want)
                if violation:
                    problems.append(f"capacity {name}: {violation}")
            else:
                amount = _q(want) if want is not None else _q(cap.value)
            amounts[name] = amount
            used = self.aggregated.get(entry.ref, {}).get(name, Fraction(0))
            if used + amount > _q(cap.value):
                problems.append(f"capacity {name}: {amount} does not fit ({used} of {cap.value} in use)")
        return amounts, problems

    def static_violations(self, spec: Spec, entry: Entry) -> list[str]:
        """Rules that involve only this device and this (sub)request (plus existing allocations)."""
        key = (spec, entry.ref)
        cached = self._static_cache.get(key)
        if cached is not None:
            return cached
        out: list[str] = []
        if spec.class_name not in self.classes:
            out.append(f"unknown device class {spec.class_name}")
        elif (failure := self.failure(spec, entry)) is not None:
            out.append(f"a selector fails on it: {failure.message}")
        elif not self.selected(spec, entry):
            out.append(f"does not match the selectors of class {spec.class_name} and request {spec.name}")
        for t in untolerated_taints(spec, entry.device):
            out.append(f"taint {t.key}={t.value}:{t.effect} is not tolerated")
        out.extend(self.share_amounts(spec, entry)[1])
        if not spec.admin and entry.ref in self.dedicated:
            out.append("already allocated to another claim")
        self._static_cache[key] = out
        return out

    def all_set(self, spec: Spec) -> list[Ref]:
        """The devices an All-mode (sub)request takes: every visible device it selects whose
        capacity fits next to existing allocations (in-use and taints are not filters)."""
        if spec not in self._all_cache:
            self._all_cache[spec] = [
                ref
                for ref in self.order
                if self.selected(spec, self.visible[ref]) and not self.share_amounts(spec, self.visible[ref])[1]
            ]
        return self._all_cache[spec]

    def make_result(self, spec: Spec, ref: Ref, share_id: str) -> model.DeviceRequestAllocationResult:
        """The API-shaped result for allocating `ref` to `spec`."""
        entry = self.visible[ref]
        multi = entry.device.allow_multiple_allocations
        amounts = self.share_amounts(spec, entry)[0]
        return model.DeviceRequestAllocationResult(
            request=spec.name,
            driver=ref.driver,
            pool=ref.pool,
            device=ref.device,
            admin_access=True if spec.admin else None,
            tolerations=spec.tolerations,
            binding_conditions=entry.device.binding_conditions,
            binding_failure_conditions=entry.device.binding_failure_conditions,
            share_id=share_id if multi else None,
            consumed_capacity={k: _quantity(v) for k, v in amounts.items()} if multi else {},
        )

    def expected_node_selector(self, entries: Sequence[Entry]) -> model.NodeSelector | None:
        """k8s-dra-core.md 3.8: the node itself for anything node-local, else the union of selectors."""
        local = False
        exprs: dict[tuple[str, str, frozenset[str]], model.NodeSelectorRequirement] = {}
        fields: dict[tuple[str, str, frozenset[str]], model.NodeSelectorRequirement] = {}
        for e in entries:
            per_device = e.slice.per_device_node_selection
            node_name = e.device.node_name if per_device else e.slice.node_name
            selector = e.device.node_selector if per_device else e.slice.node_selector
            if node_name is not None or e.device.binds_to_node:
                local = True
            elif selector is not None:
                for term in selector.terms:
                    for r in term.match_expressions:
                        exprs.setdefault((r.key, r.operator, frozenset(r.values)), r)
                    for r in term.match_fields:
                        fields.setdefault((r.key, r.operator, frozenset(r.values)), r)
        if local:
            req = model.NodeSelectorRequirement(key=_NAME_FIELD, operator="In", values=(self.node,))
            return model.NodeSelector(terms=(model.NodeSelectorTerm(match_fields=(req,)),))
        if not exprs and not fields:
            return None
        return model.NodeSelector(
            terms=(
                model.NodeSelectorTerm(match_expressions=tuple(exprs.values()), match_fields=tuple(fields.values())),
            )
        )

    def why_invisible(self, ref: Ref) -> str:
        pool = self.pools.get((ref.driver, ref.pool))
        if pool is None:
            return "no pool of that name is visible from the node at its current generation"
        if not pool.complete:
            return f"pool is {pool.problem}"
        if ref.device in pool.devices:
            return "device is not visible from the node"
        return "no such device in the pool's current generation"

    # The rules over a whole joint allocation.

    def check(
        self,
        claims: Sequence[model.ResourceClaim],
        allocations: Sequence[model.AllocationResult],
        *,
        complete: bool = True,
    ) -> list[str]:
        """Every rule the allocation breaks; [] when it is valid.

        With `complete=False` the allocation may be missing results (a search prefix): the
        rules that need every result (counts, All sets, node selectors) are relaxed to what a
        prefix can already break. Pure.
        """
        out: list[str] = []
        if len(allocations) != len(claims):
            return [f"{len(allocations)} allocation results for {len(claims)} claims"]
        uses: dict[Ref, list[tuple[int, bool]]] = defaultdict(list)  # dedicated devices: (claim, admin)
        charged: dict[Ref, Entry] = {}  # devices whose counters this allocation consumes
        share_use: dict[Ref, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        share_ids: set[tuple[Ref, str]] = set(self.share_ids)
        for i, (claim, allocation) in enumerate(zip(claims, allocations, strict=True)):
            specs = {s.name: s for r in claim.spec.requests for s in specs_of(r)}
            per_request: dict[str, list[tuple[Spec, Ref]]] = defaultdict(list)
            chosen: list[tuple[Spec, Entry]] = []
            for j, r in enumerate(allocation.results):
                ref = Ref(r.driver, r.pool, r.device)
                where = f"{claim.key} results[{j}] ({r.request} -> {ref})"
                spec = specs.get(r.request)
                if spec is None:
                    out.append(f"{where}: the claim has no request or subrequest {r.request!r}")
                    continue
                entry = self.visible.get(ref)
                if entry is None:
                    out.append(f"{where}: {self.why_invisible(ref)}")
                    continue
                out.extend(f"{where}: {m}" for m in self.static_violations(spec, entry))
                out.extend(f"{where}: {m}" for m in self._shape_violations(spec, entry, r))
                multi = entry.device.allow_multiple_allocations
                if not multi:
                    earlier = uses[ref]
                    if spec.admin and any(c == i for c, _ in earlier):
                        out.append(f"{where}: admin access takes a device twice in one claim")
                    if not spec.admin and earlier:
                        out.append(f"{where}: device is already taken earlier in this allocation")
                    earlier.append((i, spec.admin))
                if not spec.admin:
                    if not (multi and (ref in self.shared or ref in self.dedicated)):
                        charged[ref] = entry  # a shared device's counters are charged by its first share
                    if multi:
                        for k, v in self.share_amounts(spec, entry)[0].items():
                            share_use[ref][k] += v
                if multi and r.share_id:
                    if (ref, r.share_id) in share_ids:
                        out.append(f"{where}: shareID {r.share_id} is not unique for the device")
                    share_ids.add((ref, r.share_id))
                per_request[spec.request].append((spec, ref))
                chosen.append((spec, entry))
            out.extend(self._count_violations(claim, per_request, complete=complete))
            out.extend(self._constraint_violations(claim, chosen))
            if complete:
                expected = self.expected_node_selector([e for _, e in chosen])
                got = allocation.node_selector
                if (None if expected is None else _selector_key(expected)) != (
                    None if got is None else _selector_key(got)
                ):
                    out.append(f"{claim.key}: nodeSelector {_show_selector(got)}, expected {_show_selector(expected)}")
                if got is not None and not selector_matches(got, self.node, self.labels):
                    out.append(f"{claim.key}: nodeSelector {_show_selector(got)} does not select node {self.node}")
        out.extend(self._counter_violations(charged))
        for ref, used in share_use.items():
            entry = self.visible[ref]
            for k, amount in used.items():
                have = _q(entry.device.capacity[k].value) - self.aggregated.get(ref, {}).get(k, Fraction(0))
                if amount > have:
                    out.append(
                        f"{ref}: shares in this allocation consume {amount} of capacity {k}, only {have} is free"
                    )
        return out

    def _shape_violations(self, spec: Spec, entry: Entry, r: model.DeviceRequestAllocationResult) -> list[str]:
        out: list[str] = []
        if r.admin_access != (True if spec.admin else None):
            out.append(f"adminAccess is {r.admin_access}, request has adminAccess={spec.admin}")
        if tuple(r.tolerations) != spec.tolerations:
            out.append("tolerations are not a copy of the request's")
        if (
            tuple(r.binding_conditions) != entry.device.binding_conditions
            or tuple(r.binding_failure_conditions) != entry.device.binding_failure_conditions
        ):
            out.append("binding conditions are not a copy of the device's")
        if entry.device.allow_multiple_allocations:
            if not r.share_id:
                out.append("a device with allowMultipleAllocations needs a shareID")
            want = self.share_amounts(spec, entry)[0]
            got = {k: _q(v) for k, v in r.consumed_capacity.items()}
            if got != want:
                out.append(f"consumedCapacity {_show_amounts(got)}, expected {_show_amounts(want)}")
        else:
            if r.share_id is not None:
                out.append("a dedicated device has a shareID")
            if r.consumed_capacity:
                out.append("a dedicated device has consumedCapacity")
        return out

    def _count_violations(
        self, claim: model.ResourceClaim, per_request: Mapping[str, list[tuple[Spec, Ref]]], *, complete: bool
    ) -> list[str]:
        out: list[str] = []
        for request in claim.spec.requests:
            got = per_request.get(request.name, [])
            where = f"{claim.key} request {request.name}"
            if not got:
                if complete:
                    out.append(f"{where}: no devices allocated")
                continue
            names = sorted({s.name for s, _ in got})
            if len(names) > 1:
                out.append(f"{where}: results mix subrequests {names}")
                continue
            spec = got[0][0]
            refs = [ref for _, ref in got]
            if len(set(refs)) != len(refs):
                out.append(f"{where}: a device appears twice in one request")
            if spec.all_mode:
                want = self.all_set(spec)
                if self.broken:
                    out.append(
                        f"{where}: All mode cannot be satisfied on a node with unusable pools: {', '.join(self.broken)}"
                    )
                elif not want:
                    out.append(f"{where}: All mode but no device matches")
                elif complete and set(refs) != set(want):
                    out.append(
                        f"{where}: All mode took {_show_refs(refs)}, expected every matching device {_show_refs(want)}"
                    )
                elif not set(refs) <= set(want):
                    out.append(f"{where}: All mode took {_show_refs(set(refs) - set(want))} which do not match")
            elif len(refs) > spec.count or (complete and len(refs) != spec.count):
                out.append(f"{where}: {len(refs)} devices allocated, count is {spec.count}")
        return out

    def _constraint_violations(self, claim: model.ResourceClaim, chosen: Sequence[tuple[Spec, Entry]]) -> list[str]:
        out: list[str] = []
        for k, c in enumerate(claim.spec.constraints):
            name = c.match_attribute or c.distinct_attribute or ""
            where = f"{claim.key} constraints[{k}] ({'match' if c.match_attribute else 'distinct'} {name})"
            members = [e for s, e in chosen if not c.requests or s.request in c.requests or s.name in c.requests]
            values: list[tuple[Ref, frozenset[tuple[str, object]]]] = []
            for e in members:
                v = attribute_values(e, name)
                if v is None:
                    out.append(f"{where}: {e.ref} lacks the attribute")
                else:
                    values.append((e.ref, v))
            if c.match_attribute and values:
                common = frozenset.intersection(*(v for _, v in values))
                if not common:
                    out.append(f"{where}: no common value among {_show_values(values)}")
            if c.distinct_attribute:
                for (ra, va), (rb, vb) in itertools.combinations(values, 2):
                    if va & vb:
                        out.append(f"{where}: {ra} and {rb} share {_show_set(va & vb)}")
        return out

    def _counter_violations(self, charged: Mapping[Ref, Entry]) -> list[str]:
        out: list[str] = []
        totals: dict[tuple[str, str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        for entry in charged.values():
            self._charge(totals, entry)
        for key, used in sorted(totals.items()):
            driver, pool_name, set_name = key
            counters = self.pools[(driver, pool_name)].counter_sets.get(set_name)
            if counters is None:
                out.append(f"{driver}/{pool_name}: unknown counter set {set_name}")
                continue
            base = self.base_counters.get(key, {})
            for counter, value in sorted(counters.items()):
                total = base.get(counter, Fraction(0)) + used.get(counter, Fraction(0))
                if total > value:
                    drawing = _show_refs(
                        r
                        for r, e in charged.items()
                        if any(u.counter_set == set_name for u in e.device.consumes_counters)
                        and (r.driver, r.pool) == (driver, pool_name)
                    )
                    out.append(
                        f"{driver}/{pool_name} counter set {set_name}: {counter} {_num(total)} > {_num(value)} "
                        f"({_num(base.get(counter, Fraction(0)))} by allocated claims, devices {drawing})"
                    )
        return out

    # The exhaustive search.

    def find(self, claims: Sequence[model.ResourceClaim]) -> tuple[model.AllocationResult, ...] | None:
        """The first valid joint allocation in (claim, request, subrequest, device-combination)
        order, or None when none exists. Exhaustive; every answer passes `check`."""
        slots = [(i, request) for i, claim in enumerate(claims) for request in claim.spec.requests]
        results: list[list[model.DeviceRequestAllocationResult]] = [[] for _ in claims]
        serial = itertools.count()

        def current(final: bool) -> tuple[model.AllocationResult, ...]:
            if not final:
                return tuple(model.AllocationResult(results=tuple(rs)) for rs in results)
            return tuple(
                model.AllocationResult(
                    results=tuple(rs),
                    node_selector=self.expected_node_selector(
                        [self.visible[Ref(r.driver, r.pool, r.device)] for r in rs]
                    ),
                )
                for rs in results
            )

        def push(i: int, spec: Spec, ref: Ref) -> bool:
            results[i].append(self.make_result(spec, ref, f"oracle-{next(serial)}"))
            if self.check(claims, current(False), complete=False):
                results[i].pop()
                return False
            return True

        # Upstream prepares every All-mode (sub)request of every claim before searching.
        if not self.broken:
            for claim in claims:
                for request in claim.spec.requests:
                    for spec in specs_of(request):
                        if spec.all_mode and spec.class_name in self.classes:
                            for ref in self.order:
                                self.selected(spec, self.visible[ref])

        def search(slot: int) -> Iterator[tuple[model.AllocationResult, ...]]:
            if slot == len(slots):
                answer = current(True)
                if not self.check(claims, answer):
                    yield answer
                return
            i, request = slots[slot]
            for spec in specs_of(request):
                if spec.all_mode:
                    refs = [] if self.broken else self.all_set(spec)
                    pushed = 0
                    for ref in refs:
                        if not push(i, spec, ref):
                            break
                        pushed += 1
                    if refs and pushed == len(refs):
                        yield from search(slot + 1)
                    del results[i][len(results[i]) - pushed :]
                    continue
                # Failing devices stay in the list (unless another claim holds them): trying
                # one ends the search.
                failing = {ref: f for ref in self.order if (f := self.failure(spec, self.visible[ref])) is not None}
                candidates = [
                    ref
                    for ref in self.order
                    if (ref in failing and (spec.admin or ref not in self.dedicated))
                    or not self.static_violations(spec, self.visible[ref])
                ]
                yield from choose(slot, i, spec, candidates, failing, 0, spec.count)

        def choose(
            slot: int,
            i: int,
            spec: Spec,
            candidates: list[Ref],
            failing: Mapping[Ref, CelError],
            start: int,
            remaining: int,
        ) -> Iterator[tuple[model.AllocationResult, ...]]:
            if remaining == 0:
                yield from search(slot + 1)
                return
            # Too few devices left end the loop, unless a failing one is still ahead: upstream
            # tries every device and would meet it.
            last_failing = max((k for k, ref in enumerate(candidates) if ref in failing), default=-1)
            k = start
            while k < len(candidates) and (len(candidates) - k >= remaining or k <= last_failing):
                ref = candidates[k]
                if ref in failing:
                    if not self.held(spec, ref, i, results):
                        raise failing[ref]
                elif push(i, spec, ref):
                    yield from choose(slot, i, spec, candidates, failing, k + 1, remaining - 1)
                    results[i].pop()
                k += 1

        return next(search(0), None)


_PROGRAMS: dict[str, object] = {}


def _program(expression: str) -> object:
    from dractl import cel  # noqa: PLC0415

    if expression not in _PROGRAMS:
        _PROGRAMS[expression] = cel.compile(expression)
    return _PROGRAMS[expression]


def _num(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(value)


def _show_amounts(amounts: Mapping[str, Fraction]) -> str:
    return "{" + ", ".join(f"{k}: {_num(v)}" for k, v in sorted(amounts.items())) + "}"


def _show_refs(refs: object) -> str:
    return "[" + ", ".join(str(r) for r in sorted(refs)) + "]"  # type: ignore[call-overload]


def _show_set(values: frozenset[tuple[str, object]]) -> str:
    return "{" + ", ".join(f"{v!r}" for _, v in sorted(values, key=repr)) + "}"


def _show_values(values: Sequence[tuple[Ref, frozenset[tuple[str, object]]]]) -> str:
    return ", ".join(f"{ref.device}={_show_set(v)}" for ref, v in values)


def _show_selector(selector: model.NodeSelector | None) -> str:
    if selector is None:
        return "<none>"
    terms = []
    for term in selector.terms:
        reqs = [f"{r.key} {r.operator} {list(r.values)}" for r in (*term.match_expressions, *term.match_fields)]
        terms.append(" && ".join(reqs) or "<empty term>")
    return " || ".join(terms)


# --- Module-level API -------------------------------------------------------------------------


def check(
    snapshot: alloc.Snapshot,
    claims: Sequence[model.ResourceClaim],
    node: str,
    allocation_results: Sequence[model.AllocationResult],
) -> list[str]:
    """Every rule a joint allocation of `claims` on `node` breaks ([] when valid). Pure."""
    return Oracle(snapshot, node).check(claims, allocation_results)


def find_allocation(
    snapshot: alloc.Snapshot, claims: Sequence[model.ResourceClaim], node: str
) -> tuple[model.AllocationResult, ...] | None:
    """Upstream's first-fit answer on `node`: an allocation, None when none exists, or
    `CelError` when the search meets a failing selector first. Pure."""
    return Oracle(snapshot, node).find(claims)


def decide(
    snapshot: alloc.Snapshot, claims: Sequence[model.ResourceClaim], node: str
) -> tuple[model.AllocationResult, ...] | CelError | None:
    """`find_allocation` with the CEL error returned instead of raised. Pure."""
    try:
        return find_allocation(snapshot, claims, node)
    except CelError as error:
        return error


def allocatable(snapshot: alloc.Snapshot, claims: Sequence[model.ResourceClaim], node: str) -> bool:
    """Whether `claims` can be allocated jointly on `node`."""
    return find_allocation(snapshot, claims, node) is not None


def ledger_violations(snapshot: alloc.Snapshot, new_claims: Sequence[model.ResourceClaim]) -> list[str]:
    """Cumulative bookkeeping over `new_claims` (allocated by the allocator, on any nodes) on top
    of the snapshot's allocated claims: no dedicated device held twice (admin access aside), no
    counter set that new allocations consume over its values, no shared capacity overdrawn.

    Independent of nodes: pools are taken at their highest generation cluster-wide.
    """
    out: list[str] = []
    newest: dict[tuple[str, str], int] = {}
    for s in snapshot.resource_slices:
        key = (s.driver, s.pool.name)
        newest[key] = max(newest.get(key, s.pool.generation), s.pool.generation)
    devices: dict[Ref, model.Device] = {}
    counter_sets: dict[tuple[str, str, str], dict[str, Fraction]] = {}
    for s in snapshot.resource_slices:
        if s.pool.generation != newest[(s.driver, s.pool.name)]:
            continue
        for d in s.devices:
            devices[Ref(s.driver, s.pool.name, d.name)] = d
        for cs in s.shared_counters:
            counter_sets[(s.driver, s.pool.name, cs.name)] = {k: _q(v) for k, v in cs.counters.items()}

    def results(claims: Sequence[model.ResourceClaim]) -> Iterator[tuple[str, model.DeviceRequestAllocationResult]]:
        for c in claims:
            if c.allocation is not None:
                for r in c.allocation.results:
                    if not r.admin_access:
                        yield c.key, r

    holders: dict[Ref, list[str]] = defaultdict(list)
    for key, r in results(snapshot.allocated_claims):
        if r.share_id is None:
            holders[Ref(r.driver, r.pool, r.device)].append(key)
    old_refs = {Ref(r.driver, r.pool, r.device) for _, r in results(snapshot.allocated_claims)}
    new_refs: set[Ref] = set()
    capacity: dict[Ref, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    touched_capacity: set[Ref] = set()
    for _, r in itertools.chain(results(snapshot.allocated_claims), results(new_claims)):
        ref = Ref(r.driver, r.pool, r.device)
        for k, v in r.consumed_capacity.items():
            capacity[ref][k] += _q(v)
    for key, r in results(new_claims):
        ref = Ref(r.driver, r.pool, r.device)
        new_refs.add(ref)
        device = devices.get(ref)
        if device is None:
            out.append(f"{key}: {ref} does not exist")
            continue
        if device.allow_multiple_allocations and r.share_id is not None:
            touched_capacity.add(ref)
            if holders.get(ref):
                out.append(f"{key}: shares {ref} which {holders[ref]} hold dedicated")
        else:
            if holders.get(ref):
                out.append(f"{key}: {ref} is already held by {holders[ref]}")
            holders[ref].append(key)
    for ref in sorted(touched_capacity):
        for k, used in capacity[ref].items():
            cap = devices[ref].capacity.get(k)
            if cap is None or used > _q(cap.value):
                out.append(f"{ref}: capacity {k} consumed {_num(used)} of {cap.value if cap else 'nothing'}")
    totals: dict[tuple[str, str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for ref in old_refs | new_refs:
        device = devices.get(ref)
        for use in device.consumes_counters if device is not None else ():
            for k, v in use.counters.items():
                totals[(ref.driver, ref.pool, use.counter_set)][k] += _q(v)
    touched_sets = {
        (ref.driver, ref.pool, use.counter_set)
        for ref in new_refs - old_refs
        if ref in devices
        for use in devices[ref].consumes_counters
    }
    for key3 in sorted(touched_sets):
        for k, value in sorted(counter_sets.get(key3, {}).items()):
            if totals[key3][k] > value:
                out.append(f"{'/'.join(key3)}: counter {k} consumed {_num(totals[key3][k])} of {_num(value)}")
    return out
