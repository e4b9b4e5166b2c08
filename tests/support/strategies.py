"""Hypothesis strategies for small random DRA clusters and claims, and a compact printer.

Instances are small enough for `oracle` to enumerate (about eight devices per node) yet cover
every allocation feature: node-local, nodeSelector, allNodes and per-device slices; multi-slice
and incomplete pools and stale generations; int/bool/string/version and list attributes;
memory capacity; taints; MIG-like counter sets (a parent GPU and its partitions);
allowMultipleAllocations with request policies; classes and request selectors from a fixed
menu of valid CEL; ExactCount, All and firstAvailable requests; tolerations; adminAccess;
matchAttribute/distinctAttribute; and claims that already hold devices. `partition_instances`
focuses on MIG-like GPUs (counters, over-committed parents, two drivers' pools with one name),
and `regression` pins the minimal instances of discrepancies found so far.

Selectors come in three kinds: guarded ones that never fail (`in`, `.?x.orValue`), unguarded
ones that fail at run time on devices lacking an attribute (so the search order of errors is
exercised), and ones that use a whole attribute map (map literals, `dyn`, comprehensions,
computed keys), which the allocator must evaluate per device rather than share.

Invariants the generated instances keep (the oracle documents what it does not model): admin
requests never select a device with allowMultipleAllocations, every counter consumption names
every counter of its set, and pools are valid (unique device and counter-set names).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from hypothesis import settings
from hypothesis import strategies as st

from dractl import alloc, model
from support import devices

GPU = "gpu.nvidia.com"
NIC = "nic.example.com"
DRIVERS = (GPU, NIC)
NAMESPACE = "default"


def gi(n: int) -> model.quantity.Quantity:
    return model.quantity.parse(f"{n}Gi")


def q(n: int) -> model.quantity.Quantity:
    return model.quantity.from_int(n)


# Class selectors: by driver, by capacity, by attribute (all guarded so no device errors).
CLASSES: dict[str, tuple[str, ...]] = {
    "any": (),
    "gpu": (f'device.driver == "{GPU}"',),
    "nic": (f'device.driver == "{NIC}"',),
    "big": (
        '"memory" in device.capacity[device.driver] && '
        'device.capacity[device.driver].memory.compareTo(quantity("40Gi")) >= 0',
    ),
    "a100": ('device.attributes[device.driver].?model.orValue("") == "a100"',),
    "mig": ('device.attributes[device.driver].?type.orValue("") == "mig"',),
    # Fails on devices without "numa" (about one in ten).
    "numa0": ("device.attributes[device.driver].numa == 0",),
}

REQUEST_SELECTORS = (
    "device.attributes[device.driver].?numa.orValue(-1) == 0",
    '"mig" in device.attributes[device.driver] && device.attributes[device.driver].mig',
    '"driverVersion" in device.attributes[device.driver] && '
    'device.attributes[device.driver].driverVersion.isGreaterThan(semver("1.1.0"))',
    'device.attributes["example.com"].?rack.orValue("") == "r1"',
    '!("memory" in device.capacity[device.driver]) || '
    'device.capacity[device.driver].memory.compareTo(quantity("16Gi")) <= 0',
    'device.attributes[device.driver].?model.orValue("").startsWith("h")',
    # Unguarded: fail at run time on devices without the attribute.
    'device.attributes[device.driver].model == "a100"',
    "device.attributes[device.driver].mig",
    # Whole-map uses: results depend on more than the members named, so never shared.
    'device.attributes["example.com"] == {"rack": "r1"}',
    '{"rack": "r2"} != device.attributes["example.com"]',
    'dyn(device.attributes[device.driver]).?model.orValue("") == "t4"',
    'device.attributes[device.driver].exists(k, k == "mig")',
    'device.attributes[device.driver].all(k, k != "numa")',
    "device.attributes[device.driver].map(k, k).size() <= 4",
    'device.attributes[device.driver].filter(k, k.startsWith("m")).size() == 2',
    'device.attributes[device.driver][?["mo", "del"].join("")].orValue("") == "h100"',
    'size(device.capacity[device.driver]) == 0 || device.capacity[device.driver].exists(k, k == "memory")',
)

# Admin requests never meet a shareable device: the oracle leaves that combination unspecified.
NOT_SHAREABLE = '!("multi" in device.attributes["example.com"])'

# Requests favour the class that matches everything, so that most claims have candidates.
CLASS_CHOICES = ("any", "any", "any", "gpu", "nic", "big", "a100", "numa0")

# Attributes for constraints, qualified with one of the cluster's drivers (or their own domain).
CONSTRAINT_ATTRIBUTES = ("model", "numa", "mig", "driverVersion", "pcieRoots", "example.com/rack")

TOLERATIONS = (
    model.DeviceToleration(key="maint", operator="Exists"),
    model.DeviceToleration(key="flaky", operator="Equal", value="yes", effect="NoExecute"),
    model.DeviceToleration(operator="Exists", effect="NoSchedule"),
)

TAINTS = (
    model.DeviceTaint(key="maint", effect="NoSchedule"),
    model.DeviceTaint(key="flaky", value="yes", effect="NoExecute"),
    model.DeviceTaint(key="flaky", value="no", effect="NoExecute"),
    model.DeviceTaint(key="info", value="x", effect="None"),
)


class Cluster:
    """A snapshot of random nodes, slices, classes and held claims."""

    __slots__ = ("snapshot",)

    def __init__(self, snapshot: alloc.Snapshot) -> None:
        self.snapshot = snapshot

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(sorted(n.meta.name for n in self.snapshot.nodes))

    def __repr__(self) -> str:
        return "<cluster>\n" + describe(self.snapshot, ())


class Instance:
    """A cluster plus claims to allocate (jointly or in sequence, as the test decides) and the
    node a single-node test allocates on.

    Not a dataclass on purpose: hypothesis pretty-prints dataclasses field by field, and a
    falsifying example should print as the compact dump instead.
    """

    __slots__ = ("cluster", "claims", "node")

    def __init__(self, cluster: Cluster, claims: tuple[model.ResourceClaim, ...], node: str = "node-0") -> None:
        self.cluster = cluster
        self.claims = claims
        self.node = node

    @property
    def snapshot(self) -> alloc.Snapshot:
        return self.cluster.snapshot

    def __repr__(self) -> str:
        return f"<instance on {self.node}>\n" + describe(self.snapshot, self.claims)


# --- Cluster ------------------------------------------------------------------------------------


def _term(*exprs: model.NodeSelectorRequirement) -> model.NodeSelector:
    return model.NodeSelector(terms=(model.NodeSelectorTerm(match_expressions=exprs),))


ZONE_A = _term(model.NodeSelectorRequirement(key="zone", operator="In", values=("a",)))
TIER_NOT_1 = _term(model.NodeSelectorRequirement(key="tier", operator="NotIn", values=("1",)))


@st.composite
def node_binding(draw: st.DrawFn, nodes: Sequence[str], *, per_device_ok: bool) -> dict[str, object]:
    """Keyword arguments for a slice's (or device's) node selection."""
    choices = ["node", "node", "selector", "all", "all"] + (["per-device"] if per_device_ok else [])
    kind = draw(st.sampled_from(choices))
    if kind == "node":
        return {"node_name": draw(st.sampled_from(nodes))}
    if kind == "selector":
        return {"node_selector": draw(st.sampled_from((ZONE_A, TIER_NOT_1)))}
    if kind == "all":
        return {"all_nodes": True}
    return {"per_device_node_selection": True}


@st.composite
def attributes(draw: st.DrawFn) -> dict[str, model.DeviceAttribute]:
    out: dict[str, model.DeviceAttribute] = {}
    optional = {
        "model": lambda: devices.attr(
            kind=model.AttributeKind.STRING, value=draw(st.sampled_from(("a100", "h100", "t4")))
        ),
        "numa": lambda: devices.attr(kind=model.AttributeKind.INT, value=draw(st.integers(0, 1))),
        "mig": lambda: devices.attr(kind=model.AttributeKind.BOOL, value=draw(st.booleans())),
        "driverVersion": lambda: devices.attr(
            kind=model.AttributeKind.VERSION, value=draw(st.sampled_from(("1.0.0", "1.2.0", "1.2.0+b7", "2.0.0")))
        ),
        "pcieRoots": lambda: devices.attr(
            draw(st.lists(st.sampled_from(("p0", "p1", "p2")), min_size=1, max_size=2, unique=True))
        ),
        "example.com/rack": lambda: devices.attr(
            kind=model.AttributeKind.STRING, value=draw(st.sampled_from(("r1", "r2")))
        ),
    }
    for name, make in optional.items():
        if draw(st.integers(0, 9)) > 0:
            out[name] = make()
    return out


@st.composite
def request_policy(draw: st.DrawFn) -> model.CapacityRequestPolicy | None:
    kind = draw(st.sampled_from(("none", "default", "range", "range-step", "values")))
    if kind == "none":
        return None
    if kind == "default":
        return model.CapacityRequestPolicy(default=gi(8))
    if kind == "range":
        return model.CapacityRequestPolicy(
            default=gi(8), valid_range=model.CapacityRequestPolicyRange(min=gi(4), max=gi(32))
        )
    if kind == "range-step":
        return model.CapacityRequestPolicy(
            default=gi(8), valid_range=model.CapacityRequestPolicyRange(min=gi(4), step=gi(4))
        )
    return model.CapacityRequestPolicy(default=gi(8), valid_values=(gi(8), gi(16), gi(40)))


@st.composite
def device(
    draw: st.DrawFn, name: str, *, counter_sets: Sequence[model.CounterSet], nodes: Sequence[str], per_device: bool
) -> model.Device:
    attrs = draw(attributes())
    shareable = draw(st.integers(0, 5)) == 0
    capacity: dict[str, model.DeviceCapacity] = {}
    if shareable:
        attrs["example.com/multi"] = devices.attr(kind=model.AttributeKind.BOOL, value=True)
        capacity["memory"] = model.DeviceCapacity(
            value=gi(draw(st.sampled_from((40, 80)))), request_policy=draw(request_policy())
        )
    elif draw(st.integers(0, 3)) > 0:
        capacity["memory"] = model.DeviceCapacity(value=gi(draw(st.sampled_from((16, 40, 80)))))
    consumes: list[model.DeviceCounterConsumption] = []
    if counter_sets and draw(st.integers(0, 2)) > 0:
        for cs in draw(st.lists(st.sampled_from(counter_sets), min_size=1, max_size=2, unique_by=lambda c: c.name)):
            amounts = {k: q(draw(st.integers(1, int(v.value)))) for k, v in cs.counters.items()}
            consumes.append(model.DeviceCounterConsumption(counter_set=cs.name, counters=amounts))
    taints = (
        tuple(draw(st.lists(st.sampled_from(TAINTS), min_size=1, max_size=2, unique=True)))
        if draw(st.integers(0, 7)) == 0
        else ()
    )
    binding: dict[str, object] = {}
    if per_device:
        binding = draw(node_binding(nodes, per_device_ok=False))
    conditions = ("attached",) if draw(st.integers(0, 9)) == 0 else ()
    return model.Device(
        name=name,
        attributes=attrs,
        capacity=capacity,
        consumes_counters=tuple(consumes),
        taints=taints,
        allow_multiple_allocations=shareable,
        binding_conditions=conditions,
        binding_failure_conditions=("failed",) if conditions else (),
        **binding,  # type: ignore[arg-type]
    )


@st.composite
def pool_slices(
    draw: st.DrawFn, driver: str, pool: str, nodes: Sequence[str], budget: int
) -> list[model.ResourceSlice]:
    """The slices of one pool: 1-2 device slices, maybe a counter-set slice, maybe a stale one."""
    generation = draw(st.integers(1, 2))
    counter_sets: list[model.CounterSet] = []
    if draw(st.booleans()):
        for k in range(draw(st.integers(1, 2))):
            counter_sets.append(
                model.CounterSet(
                    name=f"gpu-{k}-counters",
                    counters={"mem": q(draw(st.integers(2, 8))), "sm": q(draw(st.integers(1, 7)))},
                )
            )
    slices: list[dict[str, object]] = []
    if counter_sets:
        slices.append({"shared_counters": tuple(counter_sets), **draw(node_binding(nodes, per_device_ok=False))})
    serial = 0
    for _ in range(draw(st.integers(1, 2))):
        binding = draw(node_binding(nodes, per_device_ok=True))
        per_device = bool(binding.get("per_device_node_selection"))
        drawn = []
        for _ in range(draw(st.integers(min(1, max(0, budget)), max(0, min(4, budget))))):
            drawn.append(draw(device(f"dev-{serial}", counter_sets=counter_sets, nodes=nodes, per_device=per_device)))
            serial += 1
            budget -= 1
        slices.append({"devices": tuple(drawn), **binding})
    count = len(slices) + (1 if draw(st.integers(0, 11)) == 0 else 0)  # sometimes incomplete
    out = [
        model.ResourceSlice(
            meta=model.ObjectMeta(name=f"{driver.split('.')[0]}-{pool}-s{k}"),
            driver=driver,
            pool=model.ResourcePool(name=pool, generation=generation, resource_slice_count=count),
            **fields,  # type: ignore[arg-type]
        )
        for k, fields in enumerate(slices)
    ]
    last = out[-1]
    if generation > 1 and not last.per_device_node_selection and draw(st.integers(0, 3)) == 0:
        # A stale slice of the previous generation, bound exactly like a current slice so that
        # wherever it is visible the current generation is too: it must never be used.
        stale_device = devices.device("stale-0", attributes={"model": "a100"})
        out.append(
            dataclasses.replace(
                last,
                meta=model.ObjectMeta(name=f"{last.meta.name}-old"),
                pool=model.ResourcePool(name=pool, generation=generation - 1, resource_slice_count=1),
                devices=(stale_device,),
            )
        )
    return out


@st.composite
def clusters(draw: st.DrawFn, *, max_devices: int = 8) -> Cluster:
    """1-3 nodes with labels, 1-2 drivers with 1-2 pools each, and the fixed classes."""
    node_names = [f"node-{k}" for k in range(draw(st.sampled_from((1, 1, 2, 2, 3))))]
    nodes = []
    for name in node_names:
        labels = {"zone": draw(st.sampled_from(("a", "b")))}
        if draw(st.booleans()):
            labels["tier"] = draw(st.sampled_from(("1", "2")))
        nodes.append(model.Node(meta=model.ObjectMeta(name=name, labels=labels)))
    drivers = draw(st.sampled_from(((GPU,), (GPU, NIC), (NIC,))))
    slices: list[model.ResourceSlice] = []
    budget = max_devices
    for driver in drivers:
        # Pools named after a node on purpose: two drivers' pools may share a name.
        pools = draw(st.lists(st.sampled_from(("node-0", "pool-a", "pool-b")), min_size=1, max_size=2, unique=True))
        for pool in pools:
            new = draw(pool_slices(driver, pool, node_names, budget))
            budget -= sum(len(s.devices) for s in new if s.pool.generation == new[0].pool.generation)
            slices.extend(new)
    classes = tuple(
        model.DeviceClass(meta=model.ObjectMeta(name=name), selectors=sels) for name, sels in CLASSES.items()
    )
    allocated = draw(allocated_claims(slices))
    return Cluster(
        snapshot=alloc.Snapshot(
            device_classes=classes, resource_slices=tuple(slices), nodes=tuple(nodes), allocated_claims=allocated
        )
    )


@st.composite
def allocated_claims(draw: st.DrawFn, slices: Sequence[model.ResourceSlice]) -> tuple[model.ResourceClaim, ...]:
    """0-2 claims that already hold devices: dedicated, shared (with consumed capacity) or admin."""
    held = [(s, d) for s in slices for d in s.devices if d.name != "stale-0"]
    if not held or draw(st.integers(0, 2)) > 0:
        return ()
    picked = draw(
        st.lists(
            st.sampled_from(held),
            min_size=1,
            max_size=2,
            unique_by=lambda sd: (sd[0].driver, sd[0].pool.name, sd[1].name),
        )
    )
    claims = []
    for k, (s, d) in enumerate(picked):
        admin = draw(st.integers(0, 4)) == 0 and not d.allow_multiple_allocations
        consumed: dict[str, model.quantity.Quantity] = {}
        share_id = None
        if d.allow_multiple_allocations:
            share_id = f"pre-{k}"
            consumed = {name: gi(draw(st.sampled_from((8, 16, 40)))) for name in d.capacity}
        result = model.DeviceRequestAllocationResult(
            request="r0",
            driver=s.driver,
            pool=s.pool.name,
            device=d.name,
            admin_access=True if admin else None,
            share_id=share_id,
            consumed_capacity=consumed,
        )
        spec = model.ResourceClaimSpec(
            requests=(
                model.DeviceRequest(
                    name="r0",
                    exactly=model.ExactDeviceRequest(device_class_name="any", admin_access=True if admin else None),
                ),
            )
        )
        claims.append(
            model.ResourceClaim(
                meta=model.ObjectMeta(name=f"held-{k}", namespace=NAMESPACE, uid=f"uid-held-{k}"),
                spec=spec,
                allocation=model.AllocationResult(results=(result,)),
            )
        )
    return tuple(claims)


# --- Claims -------------------------------------------------------------------------------------


def _claim(
    name: str, *requests: model.DeviceRequest, constraints: tuple[model.DeviceConstraint, ...] = ()
) -> model.ResourceClaim:
    """Claim `name` in the default namespace (uid "uid-<name>")."""
    return model.ResourceClaim(
        meta=model.ObjectMeta(name=name, namespace=NAMESPACE, uid=f"uid-{name}"),
        spec=model.ResourceClaimSpec(requests=requests, constraints=constraints),
    )


def _constraint(draw: st.DrawFn, scope: tuple[str, ...], attribute: str) -> model.DeviceConstraint:
    """A matchAttribute or (drawn) distinctAttribute constraint on `attribute` over `scope`."""
    if draw(st.booleans()):
        return model.DeviceConstraint(requests=scope, match_attribute=attribute)
    return model.DeviceConstraint(requests=scope, distinct_attribute=attribute)


@st.composite
def exact_request(draw: st.DrawFn, name: str) -> model.DeviceRequest:
    mode = "all" if draw(st.integers(0, 5)) == 0 else "count"
    admin = draw(st.integers(0, 5)) == 0
    selectors = (draw(st.sampled_from(REQUEST_SELECTORS)),) if draw(st.integers(0, 3)) == 0 else ()
    if admin:
        selectors += (NOT_SHAREABLE,)
    capacity = {"memory": gi(draw(st.sampled_from((4, 8, 10, 16, 40))))} if draw(st.integers(0, 4)) == 0 else {}
    return model.DeviceRequest(
        name=name,
        exactly=model.ExactDeviceRequest(
            device_class_name=draw(st.sampled_from(CLASS_CHOICES)),
            selectors=selectors,
            allocation_mode=model.AllocationMode.ALL if mode == "all" else model.AllocationMode.EXACT_COUNT,
            count=0 if mode == "all" else draw(st.sampled_from((1, 1, 1, 2, 2, 3))),
            admin_access=True if admin else None,
            tolerations=tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2, unique=True))),
            capacity_requests=capacity,
        ),
    )


@st.composite
def sub_request(draw: st.DrawFn, name: str) -> model.DeviceSubRequest:
    all_mode = draw(st.integers(0, 5)) == 0
    return model.DeviceSubRequest(
        name=name,
        device_class_name=draw(st.sampled_from(CLASS_CHOICES)),
        selectors=(draw(st.sampled_from(REQUEST_SELECTORS)),) if draw(st.integers(0, 3)) == 0 else (),
        allocation_mode=model.AllocationMode.ALL if all_mode else model.AllocationMode.EXACT_COUNT,
        count=0 if all_mode else draw(st.integers(1, 2)),
        tolerations=tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=1))),
        capacity_requests={"memory": gi(draw(st.sampled_from((8, 16))))} if draw(st.integers(0, 3)) == 0 else {},
    )


@st.composite
def resource_claims(draw: st.DrawFn, name: str, drivers: Sequence[str] = DRIVERS) -> model.ResourceClaim:
    """A claim with 1-3 requests (exactly count 1-3, All, or firstAvailable of two) and 0-2 constraints."""
    requests = []
    for k in range(draw(st.sampled_from((1, 1, 2, 2, 3)))):
        if draw(st.integers(0, 4)) == 0:
            requests.append(
                model.DeviceRequest(name=f"r{k}", first_available=(draw(sub_request("s0")), draw(sub_request("s1"))))
            )
        else:
            requests.append(draw(exact_request(f"r{k}")))
    refs = [r.name for r in requests] + [f"{r.name}/{s.name}" for r in requests for s in r.first_available]
    constraints = []
    for _ in range(draw(st.integers(1, 2)) if draw(st.integers(0, 3)) == 0 else 0):
        scope = tuple(draw(st.lists(st.sampled_from(refs), max_size=2, unique=True)))
        attribute = draw(st.sampled_from(CONSTRAINT_ATTRIBUTES))
        if "/" not in attribute:
            attribute = f"{draw(st.sampled_from(drivers))}/{attribute}"
        constraints.append(_constraint(draw, scope, attribute))
    return _claim(name, *requests, constraints=tuple(constraints))


@st.composite
def instances(draw: st.DrawFn, *, min_claims: int = 1, max_claims: int = 2, max_devices: int = 8) -> Instance:
    cluster = draw(clusters(max_devices=max_devices))
    n = min_claims if draw(st.booleans()) else draw(st.integers(min_claims, max_claims))
    drivers = sorted({s.driver for s in cluster.snapshot.resource_slices})
    claims = tuple(draw(resource_claims(f"c{k}", drivers)) for k in range(n))
    return Instance(cluster=cluster, claims=claims, node=draw(st.sampled_from(cluster.node_names)))


# --- Partitioned GPUs (MIG-like) ------------------------------------------------------------------

# MIG-like profiles of a GPU with 8 memory units and 7 SM slices: (memory, sm).
PROFILES = {"1g": (1, 1), "2g": (2, 2), "3g": (4, 3), "4g": (4, 4)}
PROFILE_SELECTORS = tuple(f'device.attributes[device.driver].?profile.orValue("") == "{p}"' for p in PROFILES)


@st.composite
def partitioned_clusters(draw: st.DrawFn) -> Cluster:
    """One node; per driver a pool named "node-0" (so two drivers' pools share the name) with
    1-2 GPUs, each a counter set (mem 8, sm 7) consumed by the whole GPU and its partitions.
    Allocated claims may already hold partitions, sometimes over-committing a GPU."""
    drivers = draw(st.sampled_from(((GPU,), (GPU, NIC))))
    slices: list[model.ResourceSlice] = []
    for driver in drivers:
        gpus = draw(st.integers(1, 2))
        sets = tuple(devices.counter_set(f"gpu-{g}", mem=8, sm=7) for g in range(gpus))
        made: list[model.Device] = []
        for g in range(gpus):
            common = {
                "parent": devices.attr(kind=model.AttributeKind.STRING, value=f"gpu-{g}"),
                "numa": devices.attr(kind=model.AttributeKind.INT, value=draw(st.integers(0, 1))),
                "pcieRoots": devices.attr(
                    draw(st.lists(st.sampled_from(("p0", "p1", "p2")), min_size=1, max_size=2, unique=True))
                ),
            }
            if draw(st.booleans()):
                whole = devices.consumes(f"gpu-{g}", mem=8, sm=7)
                made.append(
                    model.Device(
                        name=f"gpu-{g}",
                        attributes={
                            **common,
                            "type": devices.attr(kind=model.AttributeKind.STRING, value="gpu"),
                            "profile": devices.attr(kind=model.AttributeKind.STRING, value="7g"),
                        },
                        consumes_counters=(whole,),
                    )
                )
            for k in range(draw(st.integers(1, 3))):
                profile = draw(st.sampled_from(tuple(PROFILES)))
                mem, sm = PROFILES[profile]
                use = devices.consumes(f"gpu-{g}", mem=mem, sm=sm)
                taints = (draw(st.sampled_from(TAINTS)),) if draw(st.integers(0, 7)) == 0 else ()
                attrs = {
                    **common,
                    "type": devices.attr(kind=model.AttributeKind.STRING, value="mig"),
                    "profile": devices.attr(kind=model.AttributeKind.STRING, value=profile),
                }
                made.append(
                    devices.device(f"gpu-{g}-mig-{k}", attributes=attrs, consumes_counters=(use,), taints=taints)
                )
        split = draw(st.integers(0, len(made)))
        parts = [tuple(made[:split]), tuple(made[split:])] if draw(st.booleans()) else [tuple(made)]
        count = 1 + len(parts)
        prefix = driver.split(".")[0]
        slices.append(
            devices.rslice(
                name=f"{prefix}-counters", node="node-0", driver=driver, generation=0, count=count, counters=sets
            )
        )
        slices.extend(
            devices.rslice(*part, name=f"{prefix}-devices-{k}", node="node-0", driver=driver, generation=0, count=count)
            for k, part in enumerate(parts)
        )
    classes = tuple(
        model.DeviceClass(meta=model.ObjectMeta(name=name), selectors=sels) for name, sels in CLASSES.items()
    )
    nodes = (model.Node(meta=model.ObjectMeta(name="node-0", labels={"zone": "a"})),)
    allocated = draw(allocated_claims(slices))
    wholes = [(s, d) for s in slices for d in s.devices if d.name.count("-") == 1]
    if wholes and draw(st.booleans()):
        # An over-committed GPU: its whole device and one of its partitions are both held.
        s, whole = draw(st.sampled_from(wholes))
        parts = [d for d in s.devices if d.name.startswith(f"{whole.name}-")]
        held = [whole] + ([draw(st.sampled_from(parts))] if parts else [])
        results = tuple(
            model.DeviceRequestAllocationResult(request="r0", driver=s.driver, pool=s.pool.name, device=d.name)
            for d in held
        )
        spec = model.ResourceClaimSpec(
            requests=(
                model.DeviceRequest(
                    name="r0", exactly=model.ExactDeviceRequest(device_class_name="any", count=len(held))
                ),
            )
        )
        allocated += (
            model.ResourceClaim(
                meta=model.ObjectMeta(name="overcommit", namespace=NAMESPACE, uid="uid-overcommit"),
                spec=spec,
                allocation=model.AllocationResult(results=results),
            ),
        )
    return Cluster(
        snapshot=alloc.Snapshot(
            device_classes=classes, resource_slices=tuple(slices), nodes=nodes, allocated_claims=allocated
        )
    )


@st.composite
def partition_claims(draw: st.DrawFn, name: str, drivers: Sequence[str]) -> model.ResourceClaim:
    """1-3 requests for partitions by profile (or a fallback list), with constraints on the parent GPU."""
    requests: list[model.DeviceRequest] = []
    for k in range(draw(st.integers(1, 3))):
        cls = draw(st.sampled_from(("mig", "mig", "any", "gpu", "nic")))
        if draw(st.integers(0, 3)) == 0:
            subs = (
                model.DeviceSubRequest(
                    name="big", device_class_name=cls, selectors=(PROFILE_SELECTORS[2],), count=draw(st.integers(1, 2))
                ),
                model.DeviceSubRequest(
                    name="small",
                    device_class_name=cls,
                    selectors=(PROFILE_SELECTORS[0],),
                    count=draw(st.integers(1, 2)),
                ),
            )
            requests.append(model.DeviceRequest(name=f"r{k}", first_available=subs))
            continue
        admin = draw(st.integers(0, 5)) == 0
        selectors = (draw(st.sampled_from(PROFILE_SELECTORS)),) if draw(st.booleans()) else ()
        requests.append(
            model.DeviceRequest(
                name=f"r{k}",
                exactly=model.ExactDeviceRequest(
                    device_class_name=cls,
                    selectors=selectors,
                    count=draw(st.integers(1, 3)),
                    admin_access=True if admin else None,
                    tolerations=tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=1))),
                ),
            )
        )
    constraints = []
    if draw(st.booleans()):
        attribute = f"{draw(st.sampled_from(drivers))}/{draw(st.sampled_from(('parent', 'numa', 'pcieRoots')))}"
        scope = tuple(draw(st.lists(st.sampled_from([r.name for r in requests]), max_size=2, unique=True)))
        constraints.append(_constraint(draw, scope, attribute))
    return _claim(name, *requests, constraints=tuple(constraints))


@st.composite
def partition_instances(draw: st.DrawFn) -> Instance:
    cluster = draw(partitioned_clusters())
    drivers = sorted({s.driver for s in cluster.snapshot.resource_slices})
    n = draw(st.sampled_from((1, 1, 2)))
    return Instance(cluster=cluster, claims=tuple(draw(partition_claims(f"c{k}", drivers)) for k in range(n)))


# --- Printing -----------------------------------------------------------------------------------


def _selector(sel: model.NodeSelector | None) -> str:
    if sel is None:
        return "-"
    return " || ".join(
        " && ".join(f"{r.key} {r.operator} {','.join(r.values)}" for r in (*t.match_expressions, *t.match_fields))
        for t in sel.terms
    )


def _binding(obj: model.ResourceSlice | model.Device) -> str:
    if isinstance(obj, model.ResourceSlice) and obj.per_device_node_selection:
        return "perDevice"
    if obj.node_name is not None:
        return f"node={obj.node_name}"
    if obj.all_nodes:
        return "allNodes"
    if obj.node_selector is not None:
        return f"sel({_selector(obj.node_selector)})"
    return "-"


def _attr_text(a: model.DeviceAttribute) -> str:
    vals = a.texts if a.texts else tuple(str(v) for v in a.values)
    return "[" + ",".join(vals) + "]" if a.is_list else vals[0]


def _device(d: model.Device, per_device: bool) -> str:
    parts = [d.name]
    if d.allow_multiple_allocations:
        parts.append("MULTI")
    if per_device:
        parts.append(_binding(d))
    parts.append(" ".join(f"{k}={_attr_text(v)}" for k, v in sorted(d.attributes.items())))
    for k, c in sorted(d.capacity.items()):
        pol = ""
        if c.request_policy is not None:
            p = c.request_policy
            bits = [f"default={p.default}"] if p.default is not None else []
            if p.valid_values:
                bits.append("values=" + ",".join(str(v) for v in p.valid_values))
            if p.valid_range is not None:
                bits.append(f"range={p.valid_range.min}..{p.valid_range.max or ''}/{p.valid_range.step or ''}")
            pol = "(" + " ".join(bits) + ")"
        parts.append(f"cap.{k}={c.value}{pol}")
    for use in d.consumes_counters:
        parts.append(f"uses {use.counter_set}{{" + ",".join(f"{k}:{v}" for k, v in sorted(use.counters.items())) + "}")
    for t in d.taints:
        parts.append(f"taint {t.key}={t.value}:{t.effect}")
    if d.binding_conditions:
        parts.append(f"binding={list(d.binding_conditions)}")
    return " ".join(p for p in parts if p)


def _request(r: model.DeviceRequest) -> str:
    def one(
        name: str,
        cls: str,
        sels: Sequence[str],
        mode: model.AllocationMode,
        count: int,
        tols: Sequence[model.DeviceToleration],
        cap: object,
        admin: bool,
    ) -> str:
        bits = [f"{name}: class={cls}", "All" if mode is model.AllocationMode.ALL else f"count={count}"]
        if admin:
            bits.append("ADMIN")
        bits.extend(f"sel[{s}]" for s in sels if s != NOT_SHAREABLE)
        bits.extend(f"tol({t.key or '*'} {t.operator} {t.value} {t.effect})" for t in tols)
        if cap:
            bits.append(f"cap={ {k: str(v) for k, v in cap.items()} }")  # type: ignore[attr-defined]
        return " ".join(bits)

    if r.exactly is not None:
        e = r.exactly
        return one(
            r.name,
            e.device_class_name,
            e.selectors,
            e.allocation_mode,
            e.count,
            e.tolerations,
            e.capacity_requests,
            bool(e.admin_access),
        )
    return f"{r.name}: firstAvailable " + " | ".join(
        one(
            s.name,
            s.device_class_name,
            s.selectors,
            s.allocation_mode,
            s.count,
            s.tolerations,
            s.capacity_requests,
            False,
        )
        for s in r.first_available
    )


def describe_claim(c: model.ResourceClaim) -> str:
    lines = [f"  claim {c.key}"]
    lines.extend(f"    {_request(r)}" for r in c.spec.requests)
    for k in c.spec.constraints:
        kind = f"match {k.match_attribute}" if k.match_attribute else f"distinct {k.distinct_attribute}"
        lines.append(f"    constraint {kind} over {list(k.requests) or 'all'}")
    if c.allocation is not None:
        lines.append(f"    holds {describe_allocation(c.allocation)}")
    return "\n".join(lines)


def describe_allocation(a: model.AllocationResult | None) -> str:
    if a is None:
        return "<none>"
    parts = []
    for r in a.results:
        extra = " admin" if r.admin_access else ""
        if r.share_id:
            extra += f" share={r.share_id} " + ",".join(f"{k}:{v}" for k, v in sorted(r.consumed_capacity.items()))
        parts.append(f"{r.request}->{r.driver}/{r.pool}/{r.device}{extra}")
    return "[" + "; ".join(parts) + f"] nodeSelector={_selector(a.node_selector)}"


def describe(snapshot: alloc.Snapshot, claims: Sequence[model.ResourceClaim]) -> str:
    """A compact, readable dump of an instance for failure messages."""
    lines = ["nodes: " + ", ".join(f"{n.meta.name}{dict(n.meta.labels)}" for n in snapshot.nodes)]
    for s in snapshot.resource_slices:
        p = s.pool
        lines.append(
            f"slice {s.meta.name} {s.driver} pool={p.name} gen={p.generation} count={p.resource_slice_count} "
            f"{_binding(s)}"
        )
        for cs in s.shared_counters:
            lines.append(f"  counters {cs.name} " + ",".join(f"{k}:{v}" for k, v in sorted(cs.counters.items())))
        lines.extend(f"  {_device(d, s.per_device_node_selection)}" for d in s.devices)
    if snapshot.allocated_claims:
        lines.append("allocated:")
        lines.extend(f"  {c.key} holds {describe_allocation(c.allocation)}" for c in snapshot.allocated_claims)
    lines.append(
        "classes: "
        + "; ".join(f"{c.meta.name}={list(c.selectors)}" for c in snapshot.device_classes if c.selectors)
        + "; any=[]"
    )
    lines.append("claims:")
    lines.extend(describe_claim(c) for c in claims)
    return "\n".join(lines)


def with_allocation(claim: model.ResourceClaim, allocation: model.AllocationResult) -> model.ResourceClaim:
    return dataclasses.replace(claim, allocation=allocation)


def settings_for(max_examples: int) -> settings:
    """The profile registered in tests/property/conftest.py with this test's example budget; the deep profile
    multiplies it by ten."""
    name = os.environ.get("DRACTL_HYPOTHESIS_PROFILE", "dractl-ci")
    scale = 10 if name == "dractl-deep" else 1
    return settings(settings.get_profile(name), max_examples=max_examples * scale)


# --- Regressions --------------------------------------------------------------------------------


def _fixed(
    slices: Sequence[model.ResourceSlice],
    claims: Sequence[model.ResourceClaim],
    allocated: Sequence[model.ResourceClaim] = (),
) -> Instance:
    classes = tuple(
        model.DeviceClass(meta=model.ObjectMeta(name=name), selectors=sels) for name, sels in CLASSES.items()
    )
    nodes = (model.Node(meta=model.ObjectMeta(name="node-0", labels={"zone": "a"})),)
    snapshot = alloc.Snapshot(
        device_classes=classes, resource_slices=tuple(slices), nodes=nodes, allocated_claims=tuple(allocated)
    )
    return Instance(cluster=Cluster(snapshot), claims=tuple(claims))


def _local(*devs: model.Device) -> model.ResourceSlice:
    return devices.rslice(*devs, name="s", node="node-0", driver=GPU, generation=0)


def _exactly(**kw: object) -> model.DeviceRequest:
    exactly = model.ExactDeviceRequest(device_class_name="any", **kw)  # type: ignore[arg-type]
    return model.DeviceRequest(name="r0", exactly=exactly)


def regression(name: str) -> Instance:
    """Minimal instances of discrepancies found by these properties, pinned as explicit examples.

    - "all-untolerated-taint": All mode must fail when a matching device has an untolerated
      NoSchedule taint (the allocator used to drop the device from the All set instead).
    - "all-after-committed-share": a shareable device whose capacity a committed share used up
      leaves the All set, as it does when the share comes from the snapshot (the allocator used
      to refuse the All claim).
    - "explain-constraint-of-other-claim": explaining a failure where both claims carry a
      constraint must not crash (the allocator raised IndexError in `_explain`).
    """
    if name == "all-untolerated-taint":
        taint = model.DeviceTaint(key="maint", effect="NoSchedule")
        return _fixed(
            [_local(devices.device("d0"), devices.device("d1", taints=(taint,)))],
            [_claim("c0", _exactly(allocation_mode=model.AllocationMode.ALL, count=0))],
        )
    if name == "all-after-committed-share":
        shared = {"memory": model.DeviceCapacity(value=gi(40))}
        devs = (devices.device("d0", multi=True, capacity=shared), devices.device("d1", multi=True, capacity=shared))
        first = _claim("c0", _exactly(capacity_requests={"memory": gi(8)}))
        return _fixed(
            [_local(*devs)], [first, _claim("c1", _exactly(allocation_mode=model.AllocationMode.ALL, count=0))]
        )
    if name == "explain-constraint-of-other-claim":
        devs = (devices.device("d0"), devices.device("d1", attributes={"model": "a100"}))
        distinct = (model.DeviceConstraint(distinct_attribute=f"{GPU}/model"),)
        return _fixed(
            [_local(*devs)],
            [_claim("c0", _exactly(), constraints=distinct), _claim("c1", _exactly(), constraints=distinct)],
        )
    raise KeyError(name)
