"""Small constructors for allocator inputs, as model values (no YAML): requests, claims, nodes,
selectors, the allocator itself and readers of its outcome.

Fixture conventions follow upstream's allocator tests: driver `driver-a`, classes that select
`device.driver == "<driver>"`, nodes `node-1`, `node-2`, requests `req-0`, claims `claim-0` in
namespace `default`. Devices, slices, counters and classes come from `support.devices`, which
has the same defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dractl import alloc, model
from support.devices import DRIVER, device_class, q

DRIVER_B = "driver-b"


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


def memory_at_least(amount: str) -> str:
    """A selector: the device's capacity `memory` (driver-a) is at least `amount`."""
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{amount}")) >= 0'


def big_or_small(name: str, big: str, small: str) -> model.DeviceRequest:
    """Request `name` for the first available of subrequest "big" (memory at least `big`) and "small"
    (at least `small`), both of class-a."""
    return first_available(
        name, sub("big", "class-a", memory_at_least(big)), sub("small", "class-a", memory_at_least(small))
    )


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
    name: str,
    *devices: str,
    driver: str = DRIVER,
    pool: str = "node-1",
    admin: bool = False,
    share: Mapping[str, str | int] | None = None,
) -> model.ResourceClaim:
    """An allocated claim holding `devices`: dedicated, or with `share` a share (ID "s") that consumes
    that capacity of each device."""
    results = tuple(
        model.DeviceRequestAllocationResult(
            request="req-0",
            driver=driver,
            pool=pool,
            device=d,
            admin_access=True if admin else None,
            share_id=None if share is None else "s",
            consumed_capacity={k: q(v) for k, v in (share or {}).items()},
        )
        for d in devices
    )
    return claim(name, allocation=model.AllocationResult(results=results))


def node(name: str, **labels: str) -> model.Node:
    return model.Node(meta=model.ObjectMeta(name=name, labels=labels))


def toleration(key: str = "", *, operator: str = "Equal", value: str = "", effect: str = "") -> model.DeviceToleration:
    return model.DeviceToleration(key=key, operator=operator, value=value, effect=effect)


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


ONE_DEVICE_TWO_CLAIMS = (
    "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
    "on the candidate nodes (1 needed)\n"
    "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
    "on the candidate nodes (1 needed)\n"
    "None: every request has devices on its own, but none of the 1 candidate node has devices for all "
    "requests together"
)
"""`reasons` when two claims of one default request each can have the only device of class-a, but not both."""


def reasons(outcome: alloc.Outcome) -> str:
    assert outcome.allocations is None, "expected a failure"
    return "\n".join(f"{r.request}: {r.message}" for r in outcome.reasons)
