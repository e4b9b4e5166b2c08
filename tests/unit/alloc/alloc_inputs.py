"""Small constructors for allocator inputs, as model values (no YAML).

Fixture conventions follow upstream's allocator tests: driver `driver-a`, classes that select
`device.driver == "<driver>"`, nodes `node-1`, `node-2`, devices `device-N`, pools named after
their node, generation 1 and one slice per pool unless a test says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dractl import alloc, model
from dractl.model import quantity, semver

DRIVER = "driver-a"
DRIVER_B = "driver-b"


def attr(value: Any) -> model.DeviceAttribute:
    """A device attribute from a Python value: bool, int, str, "v:1.2.3" for a version, or a list."""
    values = value if isinstance(value, list) else [value]
    first = values[0]
    if isinstance(first, bool):
        kind = model.AttributeKind.BOOL
    elif isinstance(first, int):
        kind = model.AttributeKind.INT
    elif isinstance(first, str) and first.startswith("v:"):
        kind = model.AttributeKind.VERSION
        texts = tuple(v[2:] for v in values)
        return model.DeviceAttribute(
            kind=kind, values=tuple(semver.parse(t) for t in texts), is_list=isinstance(value, list), texts=texts
        )
    else:
        kind = model.AttributeKind.STRING
    return model.DeviceAttribute(kind=kind, values=tuple(values), is_list=isinstance(value, list))


def q(text: str | int) -> quantity.Quantity:
    return quantity.parse(text)


def device(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    capacity: Mapping[str, str | int | model.DeviceCapacity] | None = None,
    consumes: Mapping[str, Mapping[str, str | int]] | None = None,
    taints: Sequence[model.DeviceTaint] = (),
    multi: bool = False,
    **fields: Any,
) -> model.Device:
    caps = {
        k: v if isinstance(v, model.DeviceCapacity) else model.DeviceCapacity(value=q(v))
        for k, v in (capacity or {}).items()
    }
    return model.Device(
        name=name,
        attributes={k: attr(v) for k, v in (attributes or {}).items()},
        capacity=caps,
        consumes_counters=tuple(
            model.DeviceCounterConsumption(counter_set=s, counters={k: q(v) for k, v in c.items()})
            for s, c in (consumes or {}).items()
        ),
        taints=tuple(taints),
        allow_multiple_allocations=multi,
        **fields,
    )


def counter_set(name: str, **counters: str | int) -> model.CounterSet:
    return model.CounterSet(name=name, counters={k: q(v) for k, v in counters.items()})


def rslice(
    *devices: model.Device,
    name: str | None = None,
    node: str | None = "node-1",
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    counters: Sequence[model.CounterSet] = (),
    **fields: Any,
) -> model.ResourceSlice:
    """A slice; `node=None` with `node_selector`, `all_nodes` or `per_device_node_selection` in fields."""
    pool_name = pool or node or "pool"
    return model.ResourceSlice(
        meta=model.ObjectMeta(name=name or f"{pool_name}-slice"),
        driver=driver,
        pool=model.ResourcePool(name=pool_name, generation=generation, resource_slice_count=count),
        node_name=node,
        devices=tuple(devices),
        shared_counters=tuple(counters),
        **fields,
    )


def device_class(
    name: str = "class-a",
    *selectors: str,
    driver: str | None = DRIVER,
    config: Sequence[model.OpaqueDeviceConfiguration] = (),
) -> model.DeviceClass:
    sels = ((f'device.driver == "{driver}"',) if driver else ()) + selectors
    return model.DeviceClass(meta=model.ObjectMeta(name=name), selectors=sels, config=tuple(config))


def opaque(param: str, driver: str = DRIVER) -> model.OpaqueDeviceConfiguration:
    return model.OpaqueDeviceConfiguration(driver=driver, parameters={"p": param})


def request(
    name: str = "req-0",
    cls: str = "class-a",
    *selectors: str,
    count: int = 1,
    all: bool = False,
    admin: bool | None = None,
    tolerations: Sequence[model.DeviceToleration] = (),
    capacity: Mapping[str, str | int] | None = None,
) -> model.DeviceRequest:
    return model.DeviceRequest(
        name=name,
        exactly=model.ExactDeviceRequest(
            device_class_name=cls,
            selectors=tuple(selectors),
            allocation_mode=model.AllocationMode.ALL if all else model.AllocationMode.EXACT_COUNT,
            count=0 if all else count,
            admin_access=admin,
            tolerations=tuple(tolerations),
            capacity_requests={k: q(v) for k, v in (capacity or {}).items()},
        ),
    )


def sub(
    name: str,
    cls: str = "class-a",
    *selectors: str,
    count: int = 1,
    all: bool = False,
    tolerations: Sequence[model.DeviceToleration] = (),
    capacity: Mapping[str, str | int] | None = None,
) -> model.DeviceSubRequest:
    return model.DeviceSubRequest(
        name=name,
        device_class_name=cls,
        selectors=tuple(selectors),
        allocation_mode=model.AllocationMode.ALL if all else model.AllocationMode.EXACT_COUNT,
        count=0 if all else count,
        tolerations=tuple(tolerations),
        capacity_requests={k: q(v) for k, v in (capacity or {}).items()},
    )


def first_available(name: str, *subs: model.DeviceSubRequest) -> model.DeviceRequest:
    return model.DeviceRequest(name=name, first_available=tuple(subs))


def match(attribute: str, *requests: str) -> model.DeviceConstraint:
    return model.DeviceConstraint(requests=tuple(requests), match_attribute=attribute)


def distinct(attribute: str, *requests: str) -> model.DeviceConstraint:
    return model.DeviceConstraint(requests=tuple(requests), distinct_attribute=attribute)


def claim(
    name: str = "claim-0",
    *requests: model.DeviceRequest,
    constraints: Sequence[model.DeviceConstraint] = (),
    config: Sequence[model.DeviceClaimConfiguration] = (),
    allocation: model.AllocationResult | None = None,
) -> model.ResourceClaim:
    return model.ResourceClaim(
        meta=model.ObjectMeta(name=name, namespace="default"),
        spec=model.ResourceClaimSpec(
            requests=tuple(requests) or (request(),), constraints=tuple(constraints), config=tuple(config)
        ),
        allocation=allocation,
    )


def held(
    name: str, *devices: str, driver: str = DRIVER, pool: str = "node-1", admin: bool = False
) -> model.ResourceClaim:
    """An allocated claim holding `devices` (dedicated)."""
    results = tuple(
        model.DeviceRequestAllocationResult(
            request="req-0", driver=driver, pool=pool, device=d, admin_access=True if admin else None
        )
        for d in devices
    )
    return claim(name, allocation=model.AllocationResult(results=results))


def node(name: str, **labels: str) -> model.Node:
    return model.Node(meta=model.ObjectMeta(name=name, labels=labels))


def toleration(key: str = "", *, operator: str = "Equal", value: str = "", effect: str = "") -> model.DeviceToleration:
    return model.DeviceToleration(key=key, operator=operator, value=value, effect=effect)


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> model.DeviceTaint:
    return model.DeviceTaint(key=key, value=value, effect=effect)


def selector(
    *requirements: tuple[str, str, tuple[str, ...]], fields: Sequence[tuple[str, str, tuple[str, ...]]] = ()
) -> model.NodeSelector:
    return model.NodeSelector(
        terms=(
            model.NodeSelectorTerm(
                match_expressions=tuple(
                    model.NodeSelectorRequirement(key=k, operator=o, values=v) for k, o, v in requirements
                ),
                match_fields=tuple(model.NodeSelectorRequirement(key=k, operator=o, values=v) for k, o, v in fields),
            ),
        )
    )


def name_selector(node_name: str) -> model.NodeSelector:
    return selector(fields=[("metadata.name", "In", (node_name,))])


def allocator(
    slices: Sequence[model.ResourceSlice],
    classes: Sequence[model.DeviceClass] | None = None,
    *,
    nodes: Sequence[model.Node] = (),
    allocated: Sequence[model.ResourceClaim] = (),
    policy: alloc.Policy = alloc.Policy.FIRST_FIT,
    search_limit: int = 1_000_000,
) -> alloc.Allocator:
    snapshot = alloc.Snapshot(
        device_classes=tuple(classes)
        if classes is not None
        else (device_class(), device_class("class-b", driver=DRIVER_B)),
        resource_slices=tuple(slices),
        nodes=tuple(nodes),
        allocated_claims=tuple(allocated),
    )
    return alloc.Allocator(snapshot, policy=policy, search_limit=search_limit)


def picked(outcome: alloc.Outcome) -> list[list[tuple[str, str]]]:
    """Per claim, (request, device) in result order; asserts success."""
    assert outcome.allocations is not None, outcome.reasons
    return [[(r.request, r.device) for r in a.results] for a in outcome.allocations]


def reasons(outcome: alloc.Outcome) -> str:
    assert outcome.allocations is None, "expected a failure"
    return "\n".join(f"{r.request}: {r.message}" for r in outcome.reasons)


def devices(n: int, **attributes: Any) -> list[model.Device]:
    return [device(f"device-{i + 1}", attributes=attributes) for i in range(n)]
