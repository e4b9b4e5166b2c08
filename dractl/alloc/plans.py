"""Claim specs compiled for the core: request shapes, alternatives, constraints, the plan layout.

Part of the allocator (`dractl.alloc`). A shape is one distinct (class, selectors,
tolerations, capacity, admin access): its candidates are computed once (CEL through
`selectors.Selectors`, capacity policies, taints) and registered with the core. A plan is a
claim spec as the core searches it, with every reason the claim cannot be allocated anywhere
(unknown class, CEL errors, the claim limit, malformed constraints). One `Compiler` per build
of the device tables; plans are cached by spec. No search, no I/O.
"""

from __future__ import annotations

import array
import dataclasses
from collections.abc import Mapping, Sequence

from dractl import _alloc, model
from dractl.alloc import index as allocindex
from dractl.alloc import selectors as allocselectors

MAX_RESULTS = model.limits.MAX_RESULTS
"""Devices per claim (`AllocationResultsMaxSize`); the core takes it from here."""

_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

Constraint = tuple[int, int, str, list[tuple[int, int]]]
"""(kind, attribute id, text, [(request, alternative)]): one constraint of a plan."""


@dataclasses.dataclass(slots=True)
class Shape:
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
class Alt:
    """One way to satisfy a request: the request itself or one of its subrequests."""

    request: str  # the top-level request name
    name: str  # the result name: "req" or "req/sub"
    class_name: str
    shape: Shape
    all_mode: bool
    count: int
    admin: bool
    tolerations: tuple[model.DeviceToleration, ...]


@dataclasses.dataclass(slots=True)
class Plan:
    """One claim spec compiled for the core. `requests[r]` lists the alternatives in order."""

    requests: list[list[Alt]]
    constraints: list[Constraint]
    config: tuple[model.DeviceClaimConfiguration, ...]
    errors: list[tuple[str | None, str]]
    encoded: array.array[int] | None = None
    configs: dict[tuple[int, ...], tuple[model.DeviceAllocationConfiguration, ...]] = dataclasses.field(
        default_factory=dict
    )


class Compiler:
    """Compiles claim specs against one build's devices (`index`) into plans, registering their
    shapes and constraint attributes with `core`. With `binpack`, it also tells the core what
    each request asks for (`Core.set_demand`); first-fit keeps no demand.

    Not thread-safe: the allocator calls it under its lock. Caches grow with the distinct
    specs and shapes seen (`plans`, `shapes`); the allocator bounds them by rebuilding.
    """

    def __init__(
        self,
        *,
        core: _alloc.Core,
        index: allocindex.Index,
        classes: Mapping[str, model.DeviceClass],
        selectors: allocselectors.Selectors,
        binpack: bool,
    ) -> None:
        self._core = core
        self._index = index
        self._classes = classes
        self._selectors = selectors
        self._binpack = binpack
        self.shapes: dict[object, Shape] = {}
        self.plans: dict[str, Plan] = {}
        self._plans_by_id: dict[int, tuple[model.ResourceClaimSpec, Plan]] = {}
        self._attrs: dict[str, int] = {}

    def plan(self, spec: model.ResourceClaimSpec) -> Plan:
        """The compiled plan of a claim spec; cached by identity, then by value."""
        hit = self._plans_by_id.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        key = repr(spec)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._compile(spec)
        self._plans_by_id[id(spec)] = (spec, plan)
        return plan

    def forget_plans(self) -> None:
        """Drop every cached plan (they are cheap to compile again); shapes stay registered."""
        self.plans.clear()
        self._plans_by_id.clear()

    def _compile(self, spec: model.ResourceClaimSpec) -> Plan:
        """Shapes for every request and subrequest, constraint memberships, and every
        reason the claim cannot be allocated anywhere (unknown class, CEL errors, limits,
        malformed constraints). Pure apart from the caches it fills."""
        errors: list[tuple[str | None, str]] = []
        requests: list[list[Alt]] = []
        minimum = 0
        for request in spec.requests:
            alts: list[Alt] = []
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
        constraints: list[Constraint] = []
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
        if self._binpack:
            self._demand(requests, constraints)
        plan = Plan(requests=requests, constraints=constraints, config=spec.config, errors=errors)
        if not errors:
            plan.encoded = encode([plan])
        return plan

    def _demand(self, requests: Sequence[Sequence[Alt]], constraints: Sequence[Constraint]) -> None:
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
    ) -> Alt:
        """One alternative of a request; its shape is shared by every equal request."""
        capacity = spec.capacity_requests
        key = (
            spec.device_class_name,
            spec.selectors,
            spec.tolerations,
            tuple(sorted((k, v.value) for k, v in capacity.items())),
            admin,
        )
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = self._shape(
                spec.device_class_name,
                selectors=spec.selectors,
                tolerations=spec.tolerations,
                capacity=capacity,
                admin=admin,
            )
        all_mode = spec.allocation_mode is model.AllocationMode.ALL
        return Alt(
            request,
            name,
            spec.device_class_name,
            shape,
            all_mode,
            0 if all_mode else spec.count,
            admin,
            spec.tolerations,
        )

    def _shape(
        self,
        class_name: str,
        *,
        selectors: tuple[str, ...],
        tolerations: tuple[model.DeviceToleration, ...],
        capacity: Mapping[str, model.quantity.Quantity],
        admin: bool,
    ) -> Shape:
        shape = Shape()
        if not class_name:
            shape.error = "the request names no device class (deviceClassName is empty)"
            return shape
        if class_name not in self._classes:
            shape.error = (
                f"device class {class_name} does not exist; create it or name one of: "
                f"{', '.join(sorted(self._classes)) or '(none defined)'}"
            )
            return shape
        found = self._selectors.class_mask(class_name)
        shape.class_matches = found.matches
        if found.error is not None:
            shape.error = found.error
            return shape
        # The class mask is shared by every shape of the class, so it is copied.
        mask, failed, error = self._selectors.evaluate(selectors, bytearray(found.mask), where="")
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
            consumed = _consumption(device, requested=capacity)
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

    def attribute_name(self, attr_id: int) -> str:
        """The qualified name of a constraint attribute registered as `attr_id`."""
        return next(name for name, found in self._attrs.items() if found == attr_id)

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
            attribute = allocindex.lookup_attribute(ref, qualified)
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


def encode(plans: Sequence[Plan]) -> array.array[int]:
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


def _consumption(
    device: model.Device, *, requested: Mapping[str, model.quantity.Quantity]
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
