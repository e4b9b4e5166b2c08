"""Builders of device-side model values for the tests: typed attributes, capacities, counters,
devices, ResourceSlices and DeviceClasses, as model values (no YAML).

One module so that every suite (allocator, oracle, property strategies, CEL, model, node,
simulate) builds a device the same way, and a change to `model.Device` is made once. Defaults
follow upstream's allocator tests: driver `driver-a`, class `class-a` selecting
`device.driver == "<driver>"`, node `node-1`, a pool named after its node, generation 1 and
one slice per pool; a suite with other defaults passes them (or wraps these in a helper that
states them).

What it must not do: build claims or requests (their names and defaults are part of what each
suite asserts, so they stay with the suite) or share code with the allocator under test. Every
builder is pure and returns a new frozen value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dractl import model
from dractl.model import quantity, semver

DRIVER = "driver-a"


def q(text: str | int) -> quantity.Quantity:
    """A quantity from its spelling (`"40Gi"`) or an int (`4`, spelled `"4"`)."""
    return quantity.parse(text)


def attr(value: Any, *, kind: model.AttributeKind | None = None) -> model.DeviceAttribute:
    """A typed device attribute from a Python value; a `DeviceAttribute` is returned as given.

    Without `kind` the type follows the (first) value: bool, int, str, and `"v:1.2.3"` for a
    version; a list makes the list-typed variant. With `kind` the value is taken as that kind,
    a version from its text (the text is kept, as the decoder keeps it).
    """
    if isinstance(value, model.DeviceAttribute):
        return value
    is_list = isinstance(value, list)
    values = list(value) if is_list else [value]
    if kind is None:
        first = values[0]
        if isinstance(first, bool):
            kind = model.AttributeKind.BOOL
        elif isinstance(first, int):
            kind = model.AttributeKind.INT
        elif isinstance(first, str) and first.startswith("v:"):
            kind = model.AttributeKind.VERSION
            values = [v[2:] for v in values]
        else:
            kind = model.AttributeKind.STRING
    if kind is model.AttributeKind.VERSION:
        texts = tuple(str(v) for v in values)
        return model.DeviceAttribute(
            kind=kind, values=tuple(semver.parse(t) for t in texts), is_list=is_list, texts=texts
        )
    return model.DeviceAttribute(kind=kind, values=tuple(values), is_list=is_list)


def capacity(
    value: str | int | model.DeviceCapacity,
    *,
    default: str | int | None = None,
    values: Sequence[str | int] = (),
    min: str | int | None = None,
    max: str | int | None = None,
    step: str | int | None = None,
) -> model.DeviceCapacity:
    """A device capacity from a quantity's spelling or an int; a `DeviceCapacity` is returned as given.

    Any of `default`, `values` (validValues) and `min` (with `max` and `step`, a validRange) give
    it a requestPolicy; without them it has none."""
    if isinstance(value, model.DeviceCapacity):
        return value
    valid_range = (
        None
        if min is None
        else model.CapacityRequestPolicyRange(
            min=q(min), max=None if max is None else q(max), step=None if step is None else q(step)
        )
    )
    policy = (
        model.CapacityRequestPolicy(
            default=None if default is None else q(default),
            valid_values=tuple(q(v) for v in values),
            valid_range=valid_range,
        )
        if default is not None or values or valid_range
        else None
    )
    return model.DeviceCapacity(value=q(value), request_policy=policy)


def consumes(counter_set: str, **counters: str | int) -> model.DeviceCounterConsumption:
    """What a device draws from one counter set of its slice, e.g. `consumes("gpu-0", memory=4)`."""
    return model.DeviceCounterConsumption(counter_set=counter_set, counters={k: q(v) for k, v in counters.items()})


def counter_set(name: str, **counters: str | int) -> model.CounterSet:
    """A slice's shared counter set, e.g. `counter_set("gpu-0", memory=8, sm=7)`."""
    return model.CounterSet(name=name, counters={k: q(v) for k, v in counters.items()})


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> model.DeviceTaint:
    return model.DeviceTaint(key=key, value=value, effect=effect)


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
    """A device: attribute values through `attr`, capacities through `capacity`, `consumes` as
    {counter set: {counter: amount}}, `multi` for allowMultipleAllocations. Any other
    `model.Device` field goes in `fields` and wins over the shorthand (e.g. `consumes_counters=`)."""
    values: dict[str, Any] = {
        "name": name,
        "attributes": {k: attr(v) for k, v in (attributes or {}).items()},
        "capacity": {k: _capacity(v) for k, v in (capacity or {}).items()},
        "consumes_counters": tuple(_consumes(s, c) for s, c in (consumes or {}).items()),
        "taints": tuple(taints),
        "allow_multiple_allocations": multi,
    }
    values.update(fields)
    return model.Device(**values)


def devices(n: int, **attributes: Any) -> list[model.Device]:
    """`device-1` .. `device-n`, each with the same attributes."""
    return [device(f"device-{i + 1}", attributes=attributes) for i in range(n)]


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
    """A slice of `node`'s pool (named after the node unless `pool` is given); `node=None` with
    `node_selector`, `all_nodes` or `per_device_node_selection` in fields. Other
    `model.ResourceSlice` fields go in `fields` and win over the shorthand."""
    pool_name = pool or node or "pool"
    values: dict[str, Any] = {
        "meta": model.ObjectMeta(name=name or f"{pool_name}-slice"),
        "driver": driver,
        "pool": model.ResourcePool(name=pool_name, generation=generation, resource_slice_count=count),
        "node_name": node,
        "devices": tuple(devices),
        "shared_counters": tuple(counters),
    }
    values.update(fields)
    return model.ResourceSlice(**values)


def partitioned(
    *devices: model.Device, counters: Sequence[model.CounterSet], node: str = "node-1", driver: str = DRIVER
) -> list[model.ResourceSlice]:
    """`node`'s pool as partitionable devices are published, in two slices: the shared `counters` in
    `<node>-a-counters`, then `devices` in `<node>-b-devices`."""
    return [
        rslice(name=f"{node}-a-counters", node=node, driver=driver, count=2, counters=counters),
        rslice(*devices, name=f"{node}-b-devices", node=node, driver=driver, count=2),
    ]


def device_class(
    name: str = "class-a",
    *selectors: str,
    driver: str | None = DRIVER,
    config: Sequence[model.OpaqueDeviceConfiguration] = (),
) -> model.DeviceClass:
    """A class selecting `device.driver == "<driver>"` (no driver selector when `driver` is None)
    and then `selectors`."""
    sels = ((f'device.driver == "{driver}"',) if driver else ()) + selectors
    return model.DeviceClass(meta=model.ObjectMeta(name=name), selectors=sels, config=tuple(config))


# The keyword arguments of `device` shadow the builders of the same name inside it.
_capacity = capacity


def _consumes(counter_set: str, counters: Mapping[str, str | int]) -> model.DeviceCounterConsumption:
    return consumes(counter_set, **counters)
