"""ResourceSlice: pool, node selection, devices with typed attributes, capacities, counters and taints.

What it does: applies the API's formats and limits to everything a driver publishes (at most 128 devices, 64 with
taints, counters or list attributes; 32 attributes and capacities per device ...). What it must not do: check
counters across slices of a pool (the allocator does). Pure; equal attribute values are shared between devices.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from dractl.model import quantity, semver, types
from dractl.model.decode import common, node_selectors, problems, seed_hints

_SLICE_SPEC_KEYS = frozenset(
    {"driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection", "devices", "sharedCounters"}
)
_POOL_KEYS = frozenset({"name", "generation", "resourceSliceCount"})
_DEVICE_KEYS = frozenset(
    {
        "name",
        "attributes",
        "capacity",
        "consumesCounters",
        "nodeName",
        "nodeSelector",
        "allNodes",
        "taints",
        "bindsToNode",
        "bindingConditions",
        "bindingFailureConditions",
        "allowMultipleAllocations",
    }
)
_BASIC_KEYS = _DEVICE_KEYS - {"name"}
_WRAPPED_DEVICE_KEYS = frozenset({"name", "basic"})
_COUNTER_SET_KEYS = frozenset({"name", "counters"})
_COUNTER_KEYS = frozenset({"value"})
_CONSUMPTION_KEYS = frozenset({"counterSet", "counters"})
_TAINT_KEYS = frozenset({"key", "value", "effect", "timeAdded"})
_CAPACITY_KEYS = frozenset({"value", "requestPolicy"})
_POLICY_KEYS = frozenset({"default", "validValues", "validRange"})
_RANGE_KEYS = frozenset({"min", "max", "step"})
_SCALAR_KINDS = {kind.value: kind for kind in types.AttributeKind}
_LIST_KINDS = {kind.value + "s": kind for kind in types.AttributeKind}
_ATTRIBUTE_HINTS = {
    "quantity": "attributes have no quantity type: put sizes in the device's capacity, e.g. memory: {value: 80Gi}",
    "value": "attribute values are typed: write {string: ...}, {int: ...}, {bool: ...} or {version: ...} "
    "(value is for capacity)",
}


def resource_slice(o: problems.Report, raw: Mapping[str, Any], source: types.Source) -> types.ResourceSlice:
    meta = common.object_meta(o, raw, namespaced=False)
    spec = common.as_map(o, raw.get("spec"), "spec", _SLICE_SPEC_KEYS)
    if spec is None:
        o.error("spec", "required: a slice names its driver, pool, node and devices")
        spec = {}
    driver = common.required_str(o, spec, "driver", "spec", " (the DRA driver's name, e.g. gpu.nvidia.com)")
    if driver:
        common.check(o, "spec.driver", common.driver_name(driver))
    pool = _pool(o, spec.get("pool"))
    node_name = common.as_str(o, spec, "nodeName", "spec")
    node_selector = None
    if spec.get("nodeSelector") is not None:
        node_selector = node_selectors.node_selector(o, spec["nodeSelector"], "spec.nodeSelector")
        if len(node_selector.terms) > 1:
            o.error("spec.nodeSelector.nodeSelectorTerms", "must have exactly one node selector term")
    all_nodes = common.as_bool(o, spec, "allNodes", "spec")
    per_device = common.as_bool(o, spec, "perDeviceNodeSelection", "spec")
    _node_selection(
        o,
        "spec",
        options=_SLICE_NODE_OPTIONS,
        node_name=node_name,
        node_selector=node_selector,
        all_nodes=all_nodes,
        per_device=per_device,
    )
    if spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        o.error(
            "spec", "only one of devices or sharedCounters is allowed: publish counter sets in a slice of their own"
        )
    devices = _devices(o, spec.get("devices"), per_device=bool(per_device))
    counter_sets = [
        types.CounterSet(name=name, counters=counters)
        for name, counters in _named_counters(
            o,
            spec.get("sharedCounters"),
            "spec.sharedCounters",
            limit=common.MAX_COUNTER_SETS,
            keys=_COUNTER_SET_KEYS,
            name_key="name",
        )
    ]
    return types.ResourceSlice(
        meta=meta,
        driver=driver,
        pool=pool,
        node_name=node_name or None,
        node_selector=node_selector,
        all_nodes=bool(all_nodes),
        per_device_node_selection=bool(per_device),
        devices=devices,
        shared_counters=tuple(counter_sets),
        source=source,
    )


def _pool(o: problems.Report, raw: object) -> types.ResourcePool:
    p = common.as_map(o, raw, "spec.pool", _POOL_KEYS)
    if p is None:
        o.error("spec.pool", "required: write pool: {name: <node name>, resourceSliceCount: 1}")
        return types.ResourcePool(name="")
    name = common.required_str(o, p, "name", "spec.pool")
    if name:
        common.check(o, "spec.pool.name", common.pool_name(name))
    generation = common.as_int(o, p, "generation", "spec.pool") or 0
    if generation < 0:
        o.error("spec.pool.generation", "must be >= 0")
    count = common.as_int(o, p, "resourceSliceCount", "spec.pool")
    if p.get("resourceSliceCount") is None:
        o.error("spec.pool.resourceSliceCount", "required: the number of slices in this pool, usually 1")
    elif count is not None and count < 1:
        o.error("spec.pool.resourceSliceCount", "must be >= 1")
    return types.ResourcePool(name=name, generation=generation, resource_slice_count=count or 1)


_SLICE_NODE_OPTIONS = "nodeName, nodeSelector, allNodes or perDeviceNodeSelection"
_DEVICE_NODE_OPTIONS = "nodeName, nodeSelector or allNodes"


def _node_selection(
    o: problems.Report,
    path: str,
    *,
    options: str,
    node_name: str | None,
    node_selector: types.NodeSelector | None,
    all_nodes: bool | None,
    per_device: bool | None,
) -> None:
    """Exactly one way of naming the nodes (a device has no perDeviceNodeSelection: pass None)."""
    chosen = []
    if node_name is not None:
        if node_name:
            chosen.append("nodeName")
            common.check(o, f"{path}.nodeName", common.dns_subdomain(node_name))
        else:
            o.error(f"{path}.nodeName", "must be unset or a node name")
    if node_selector is not None:
        chosen.append("nodeSelector")
    if all_nodes is not None:
        if all_nodes:
            chosen.append("allNodes")
        else:
            o.error(f"{path}.allNodes", "must be unset or true")
    if per_device is not None:
        if per_device:
            chosen.append("perDeviceNodeSelection")
        else:
            o.error(f"{path}.perDeviceNodeSelection", "must be unset or true")
    if not chosen:
        o.error(path, f"exactly one of {options} is required, e.g. nodeName: <node>")
    elif len(chosen) > 1:
        o.error(path, f"exactly one of {options} is allowed, but {', '.join(chosen)} are set")


def _devices(o: problems.Report, raw: object, *, per_device: bool) -> tuple[types.Device, ...]:
    items = common.as_list(o, raw, "spec.devices", common.MAX_DEVICES)
    devices = []
    names: set[str] = set()
    advanced = False
    for i, item in enumerate(items):
        # A device `_fast_device` takes is valid and plain (no taints, counters or lists): it
        # needs no path for messages and cannot make the slice `advanced`.
        device = None if per_device else _fast_device(item)
        if device is None:
            device = _device(o, item, f"spec.devices[{i}]", per_device=per_device)
            if device is None:
                continue
            advanced = advanced or bool(
                device.taints or device.consumes_counters or any(a.is_list for a in device.attributes.values())
            )
        if device.name in names:
            o.error(f"spec.devices[{i}].name", f"duplicate device name {common.quote(device.name)}")
        names.add(device.name)
        devices.append(device)
    if advanced and len(devices) > common.MAX_DEVICES_ADVANCED:
        limit = (
            f"must have at most {common.MAX_DEVICES_ADVANCED} items when devices use taints, "
            "consumesCounters or list attributes"
        )
        o.error("spec.devices", f"{limit}, got {len(devices)}")
    return tuple(devices)


def _device(o: problems.Report, raw: object, path: str, *, per_device: bool) -> types.Device | None:
    if not isinstance(raw, dict):
        o.error(path, f"must be an object (a YAML mapping), got {common.kind_of(raw)}")
        return None
    if raw.keys() <= _PLAIN_DEVICE_KEYS and not per_device:
        return _plain_device(o, raw, path)
    m: dict[str, Any] = raw
    fields_path = path
    if "basic" in raw:
        # v1beta1 and v1alpha3 wrapped everything but the name in `basic`.
        basic = common.as_map(o, raw["basic"], f"{path}.basic", _BASIC_KEYS)
        if not o.beta1:
            o.error(
                f"{path}.basic",
                "the basic: wrapper is gone in resource.k8s.io/v1: move its attributes and capacity up into the device",
            )
        if basic is not None:
            fields_path = f"{path}.basic"
            m = {**basic, "name": raw.get("name")}
        common.check_keys(o, raw, path, _WRAPPED_DEVICE_KEYS)
    else:
        common.check_keys(o, raw, path, _DEVICE_KEYS)
    name = common.required_str(o, raw, "name", path)
    if name:
        common.check(o, f"{path}.name", common.dns_label(name))
    allow_multiple = bool(common.as_bool(o, m, "allowMultipleAllocations", fields_path))
    attributes, capacity = _attributes_and_capacity(o, m, fields_path, allow_multiple=allow_multiple)
    consumes = [
        types.DeviceCounterConsumption(counter_set=name, counters=counters)
        for name, counters in _named_counters(
            o,
            m.get("consumesCounters"),
            f"{fields_path}.consumesCounters",
            limit=common.MAX_CONSUMES_COUNTERS,
            keys=_CONSUMPTION_KEYS,
            name_key="counterSet",
        )
    ]
    node_name = common.as_str(o, m, "nodeName", fields_path)
    node_selector = (
        node_selectors.node_selector(o, m["nodeSelector"], f"{fields_path}.nodeSelector")
        if m.get("nodeSelector") is not None
        else None
    )
    all_nodes = common.as_bool(o, m, "allNodes", fields_path)
    if per_device:
        _node_selection(
            o,
            fields_path,
            options=_DEVICE_NODE_OPTIONS,
            node_name=node_name,
            node_selector=node_selector,
            all_nodes=all_nodes,
            per_device=None,
        )
    elif node_name is not None or node_selector is not None or all_nodes is not None:
        o.error(
            fields_path,
            "nodeName, nodeSelector and allNodes on a device need perDeviceNodeSelection: true in the slice spec",
        )
    conditions, failures = (
        ((), ())
        if "bindingConditions" not in m and "bindingFailureConditions" not in m
        else common.binding_conditions(o, m, fields_path)
    )
    return types.Device(
        name=name,
        attributes=attributes,
        capacity=capacity,
        consumes_counters=tuple(consumes),
        node_name=node_name or None,
        node_selector=node_selector,
        all_nodes=bool(all_nodes),
        taints=_taints(o, m.get("taints"), f"{fields_path}.taints"),
        binds_to_node=bool(common.as_bool(o, m, "bindsToNode", fields_path)),
        binding_conditions=conditions,
        binding_failure_conditions=failures,
        allow_multiple_allocations=allow_multiple,
    )


_PLAIN_DEVICE_KEYS = frozenset({"name", "attributes", "capacity"})


def _fast_device(raw: object) -> types.Device | None:
    """The device `_device` would make of `raw` without any message, when `raw` has the common
    shape (a valid name, scalar attributes and plain capacities, nothing else); None sends it
    the long way, which reports what is wrong. Pure.

    Thousands of GPUs look like this, and building no path strings and calling no reporting
    helpers is what makes it fast. Equal results: every value comes from the same memoised
    constructors as `_attributes` and `_capacities` use, and the only limit such a device can
    break (attributes and capacities together) is checked; the 48-values limit cannot be hit,
    as scalars hold one value each and at most 32 fit."""
    if type(raw) is not dict or not raw.keys() <= _PLAIN_DEVICE_KEYS:
        return None
    name = raw.get("name")
    if type(name) is not str or not name or common.dns_label(name) is not None:
        return None
    attributes = _fast_attributes(raw.get("attributes"))
    capacity = _fast_capacities(raw.get("capacity"))
    if attributes is None or capacity is None or len(attributes) + len(capacity) > common.MAX_ATTRIBUTES_AND_CAPACITY:
        return None
    return types.Device(name=name, attributes=attributes, capacity=capacity)


def _fast_attributes(raw: object) -> dict[str, types.DeviceAttribute] | None:
    """`_attributes` for a mapping of valid scalar attributes under valid names, else None. Pure."""
    if raw is None:
        return {}
    if type(raw) is not dict:
        return None
    result = {}
    for name, value in raw.items():
        if type(value) is not dict or len(value) != 1 or type(name) is not str:
            return None
        ((kind, item),) = value.items()
        if type(item) not in _FAST_TYPES.get(kind, ()):
            return None
        attribute = _named_scalar_attribute(name, kind, item)
        if attribute is None:
            return None
        result[name] = attribute
    return result


def _fast_capacities(raw: object) -> dict[str, types.DeviceCapacity] | None:
    """`_capacities` for a mapping of `name: {value: <quantity text>}` entries that are all valid, else None. Pure."""
    if raw is None:
        return {}
    if type(raw) is not dict:
        return None
    result = {}
    for name, value in raw.items():
        if type(name) is not str or type(value) is not dict or len(value) != 1:
            return None
        text = value.get("value")
        if type(text) is not str:
            return None
        capacity = _plain_capacity(name, text)
        if capacity is None:
            return None
        result[name] = capacity
    return result


def _plain_device(o: problems.Report, raw: Mapping[str, Any], path: str) -> types.Device:
    """`_device` for the common shape, a name with attributes and capacity only (what GPU drivers
    publish for whole GPUs): the same checks, without looking up the dozen fields it lacks."""
    name = common.required_str(o, raw, "name", path)
    if name:
        common.check(o, f"{path}.name", common.dns_label(name))
    attributes, capacity = _attributes_and_capacity(o, raw, path, allow_multiple=False)
    return types.Device(name=name, attributes=attributes, capacity=capacity)


def _attributes_and_capacity(
    o: problems.Report, m: Mapping[str, Any], path: str, *, allow_multiple: bool
) -> tuple[dict[str, types.DeviceAttribute], dict[str, types.DeviceCapacity]]:
    """The `attributes` and `capacity` of the device fields `m` (at `path`), with the API's limits on their
    number and on the attribute values in total checked."""
    attributes = _attributes(o, m.get("attributes"), f"{path}.attributes")
    capacity = _capacities(o, m.get("capacity"), f"{path}.capacity", allow_multiple=allow_multiple)
    if len(attributes) + len(capacity) > common.MAX_ATTRIBUTES_AND_CAPACITY:
        o.error(
            path,
            f"must have at most {common.MAX_ATTRIBUTES_AND_CAPACITY} attributes and capacities together, got "
            f"{len(attributes) + len(capacity)}",
        )
    values = sum(len(a.values) for a in attributes.values())
    if values > common.MAX_ATTRIBUTE_VALUES:
        o.error(path, f"must have at most {common.MAX_ATTRIBUTE_VALUES} attribute values in total, got {values}")
    return attributes, capacity


def _attributes(o: problems.Report, raw: object, path: str) -> dict[str, types.DeviceAttribute]:
    m = common.as_map(o, raw, path)
    if not m:
        return {}
    result = {}
    for name, value in m.items():
        # Fast path: a well-named, well-formed scalar, one memoised lookup without a path string.
        if type(value) is dict and len(value) == 1 and type(name) is str:
            ((kind, item),) = value.items()
            if type(item) in _FAST_TYPES.get(kind, ()):
                attribute = _named_scalar_attribute(name, kind, item)
                if attribute is not None:
                    result[name] = attribute
                    continue
        key = str(name)
        problem = common.qualified_name(key)
        if problem is not None:
            o.error(f"{path}[{key}]", problem)
        attribute = _attribute(o, key, value, f"{path}[{key}]")
        if attribute is not None:
            result[key] = attribute
    return result


_FAST_TYPES: Mapping[str, tuple[type, ...]] = {"string": (str,), "version": (str,), "int": (int,), "bool": (bool,)}


@functools.lru_cache(maxsize=65536)
def _named_scalar_attribute(name: str, kind: str, item: str | int | bool) -> types.DeviceAttribute | None:
    """`_scalar_attribute` when `name` is a valid attribute name; None sends it the long way (with messages)."""
    return None if common.qualified_name(name) is not None else _scalar_attribute(kind, item)


@functools.lru_cache(maxsize=65536)
def _scalar_attribute(kind: str, item: str | int | bool) -> types.DeviceAttribute | None:
    """A valid scalar attribute, or None to let `_attribute` report the problem.

    Equal values repeat on every device of a cluster (product names, driver versions);
    sharing one immutable value saves time and memory.
    """
    if isinstance(item, str):
        if len(item) > common.MAX_ATTRIBUTE_LENGTH:
            return None
        if kind == "version":
            try:
                version = semver.parse(item)
            except semver.SemverError:
                return None
            return types.DeviceAttribute(kind=types.AttributeKind.VERSION, values=(version,), texts=(item,))
        return types.DeviceAttribute(kind=types.AttributeKind.STRING, values=(item,))
    if kind == "int" and item not in common.INT64:
        return None
    return types.DeviceAttribute(kind=_SCALAR_KINDS[kind], values=(item,))


def _attribute(o: problems.Report, name: str, value: object, path: str) -> types.DeviceAttribute | None:
    if not isinstance(value, dict):
        o.error(path, seed_hints.plain_attribute_hint(name, value))
        return None
    common.check_keys(o, value, path, frozenset(_SCALAR_KINDS) | frozenset(_LIST_KINDS), _ATTRIBUTE_HINTS)
    present = [key for key in value if key in _SCALAR_KINDS or key in _LIST_KINDS]
    if len(present) != 1:
        if present:
            o.error(path, f"exactly one typed value is allowed, but {', '.join(present)} are set")
        elif value.keys() <= frozenset(_SCALAR_KINDS) | frozenset(_LIST_KINDS):
            o.error(
                path, "exactly one typed value is required: {string: ...}, {int: ...}, {bool: ...} or {version: ...}"
            )
        return None
    key = present[0]
    is_list = key in _LIST_KINDS
    kind = _LIST_KINDS[key] if is_list else _SCALAR_KINDS[key]
    items = value[key]
    if is_list:
        if not isinstance(items, list):
            o.error(f"{path}.{key}", f"must be a list, got {common.kind_of(items)}")
            return None
        if not items:
            o.error(f"{path}.{key}", "must not be empty")
            return None
    else:
        items = [items]
    values: list[types.AttributeScalar] = []
    texts: list[str] = []
    for i, item in enumerate(items):
        ipath = f"{path}.{key}[{i}]" if is_list else f"{path}.{key}"
        if kind is types.AttributeKind.INT:
            if not isinstance(item, int) or isinstance(item, bool):
                o.error(ipath, f"must be an integer, got {common.kind_of(item)}")
                return None
            if item not in common.INT64:
                o.error(ipath, "must fit in 64 bits")
            values.append(item)
        elif kind is types.AttributeKind.BOOL:
            if not isinstance(item, bool):
                o.error(ipath, f"must be true or false, got {common.kind_of(item)}")
                return None
            values.append(item)
        elif not isinstance(item, str):
            o.error(
                ipath,
                f"must be a string, got {common.kind_of(item)}: quote it, e.g. "
                f"{common.quote(common.yaml_scalar(item))}",
            )
            return None
        else:
            if len(item) > common.MAX_ATTRIBUTE_LENGTH:
                o.error(ipath, f"must be at most {common.MAX_ATTRIBUTE_LENGTH} characters, got {len(item)}")
            if kind is types.AttributeKind.VERSION:
                try:
                    values.append(semver.parse(item))
                except semver.SemverError as error:
                    o.error(ipath, str(error))
                    return None
                texts.append(item)
            else:
                values.append(item)
    return types.DeviceAttribute(kind=kind, values=tuple(values), is_list=is_list, texts=tuple(texts))


def _capacities(o: problems.Report, raw: object, path: str, *, allow_multiple: bool) -> dict[str, types.DeviceCapacity]:
    m = common.as_map(o, raw, path)
    if not m:
        return {}
    result = {}
    for name, value in m.items():
        # Fast path: `name: {value: <text>}` under a well-formed name, one memoised lookup.
        if type(name) is str and type(value) is dict and len(value) == 1 and type(value.get("value")) is str:
            capacity = _plain_capacity(name, value["value"])
            if capacity is not None:
                result[name] = capacity
                continue
        key = str(name)
        cpath = f"{path}[{key}]"
        common.check(o, cpath, common.qualified_name(key))
        if not isinstance(value, dict):
            shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else common.quote(value)
            o.error(cpath, f"capacity entries are objects: write {key}: {{value: {shown}}}")
            continue
        common.check_keys(o, value, cpath, _CAPACITY_KEYS)
        if value.get("value") is None:
            o.error(f"{cpath}.value", "required (a quantity such as 80Gi)")
            continue
        total = common.as_quantity(o, value["value"], f"{cpath}.value")
        policy = None
        if value.get("requestPolicy") is not None:
            if not allow_multiple:
                o.error(f"{cpath}.requestPolicy", "only allowed when the device sets allowMultipleAllocations: true")
            policy = _request_policy(o, value["requestPolicy"], f"{cpath}.requestPolicy", total)
        result[key] = types.DeviceCapacity(value=total, request_policy=policy)
    return result


@functools.lru_cache(maxsize=4096)
def _plain_capacity(name: str, text: str) -> types.DeviceCapacity | None:
    """`_capacities`' entry for `name: {value: text}` when the name and the quantity are valid
    and the quantity fits in an int64; None sends it the long way (with messages). Pure:
    the same sizes repeat on every device of a cluster."""
    if common.qualified_name(name) is not None:
        return None
    try:
        total = quantity.parse(text)
    except quantity.QuantityError:
        return None
    return types.DeviceCapacity(value=total) if quantity.fits_int64(total) else None


def _request_policy(
    o: problems.Report, raw: object, path: str, total: quantity.Quantity
) -> types.CapacityRequestPolicy | None:
    p = common.as_map(o, raw, path, _POLICY_KEYS)
    if p is None:
        return None
    default = common.as_quantity(o, p["default"], f"{path}.default") if p.get("default") is not None else None
    if default is not None and total < default:
        o.error(f"{path}.default", f"must not be larger than the capacity value {total}")
    listed = common.as_list(o, p.get("validValues"), f"{path}.validValues", common.MAX_VALID_VALUES)
    valid_values = tuple(common.as_quantity(o, v, f"{path}.validValues[{i}]") for i, v in enumerate(listed))
    valid_range = None
    if valid_values and p.get("validRange") is not None:
        o.error(path, "at most one of validValues or validRange is allowed")
    elif valid_values:
        for i, v in enumerate(valid_values):
            if i and not valid_values[i - 1] < v:
                o.error(f"{path}.validValues[{i}]", "values must be unique and in ascending order")
            if total < v:
                o.error(f"{path}.validValues[{i}]", f"must not be larger than the capacity value {total}")
        if default is None:
            o.error(f"{path}.default", "required when validValues is set")
        elif default not in valid_values:
            o.error(f"{path}.default", "must be one of validValues")
    elif p.get("validRange") is not None:
        valid_range = _valid_range(o, p["validRange"], f"{path}.validRange", total, default)
        if default is None:
            o.error(f"{path}.default", "required when validRange is set")
    return types.CapacityRequestPolicy(default=default, valid_values=valid_values, valid_range=valid_range)


def _valid_range(
    o: problems.Report, raw: object, path: str, total: quantity.Quantity, default: quantity.Quantity | None
) -> types.CapacityRequestPolicyRange | None:
    r = common.as_map(o, raw, path, _RANGE_KEYS)
    if r is None:
        return None
    if r.get("min") is None:
        o.error(f"{path}.min", "required when validRange is set")
        return None
    low = common.as_quantity(o, r["min"], f"{path}.min")
    high = common.as_quantity(o, r["max"], f"{path}.max") if r.get("max") is not None else None
    step = common.as_quantity(o, r["step"], f"{path}.step") if r.get("step") is not None else None
    if low.value < 0:
        o.error(f"{path}.min", "must be >= 0")
    if total < low:
        o.error(f"{path}.min", f"must not be larger than the capacity value {total}")
    if default is not None and default < low:
        o.error(f"{path}.min", f"must not be larger than default {default}")
    if high is not None:
        if high < low:
            o.error(f"{path}.max", f"must not be smaller than min {low}")
        if total < high:
            o.error(f"{path}.max", f"must not be larger than the capacity value {total}")
        if default is not None and high < default:
            o.error(f"{path}.max", f"must not be smaller than default {default}")
    if step is not None:
        if step.value <= 0:
            o.error(f"{path}.step", "must be > 0")
        else:
            if total.value < low.value + step.value:
                o.error(f"{path}.step", f"min + step must not be larger than the capacity value {total}")
            for label, value in (("default", default), ("max", high)):
                if value is not None and (value.value - low.value) % step.value:
                    o.error(f"{path}.step", f"{label} {value} is not min {low} plus a multiple of step {step}")
    return types.CapacityRequestPolicyRange(min=low, max=high, step=step)


def _named_counters(
    o: problems.Report, raw: object, path: str, *, limit: int, keys: frozenset[str], name_key: str
) -> list[tuple[str, dict[str, quantity.Quantity]]]:
    """A list of entries that each name a counter set (unique, a DNS label) and hold
    counters: a slice's `sharedCounters` or a device's `consumesCounters`."""
    entries = []
    seen: set[str] = set()
    for i, item in enumerate(common.as_list(o, raw, path, limit)):
        cpath = f"{path}[{i}]"
        c = common.as_map(o, item, cpath, keys)
        if c is None:
            continue
        name = common.unique_label(o, c, name_key, cpath, seen=seen, what="counter set")
        entries.append((name, _counters(o, c, cpath)))
    return entries


def _counters(o: problems.Report, m: Mapping[str, Any], path: str) -> dict[str, quantity.Quantity]:
    raw = m.get("counters")
    counters = common.as_map(o, raw, f"{path}.counters")
    if not counters:
        if raw is None or counters is not None:
            o.error(f"{path}.counters", "required: write counters: {<name>: {value: <quantity>}}")
        return {}
    if len(counters) > common.MAX_COUNTERS:
        o.error(f"{path}.counters", f"must have at most {common.MAX_COUNTERS} entries, got {len(counters)}")
        return {}
    result = {}
    for name, value in counters.items():
        cpath = f"{path}.counters[{name}]"
        common.check(o, cpath, common.dns_label(str(name)))
        if not isinstance(value, dict) or value.get("value") is None:
            o.error(cpath, f"counters are objects: write {name}: {{value: <quantity>}}")
            continue
        common.check_keys(o, value, cpath, _COUNTER_KEYS)
        result[str(name)] = common.as_quantity(o, value["value"], f"{cpath}.value")
    return result


def _taints(o: problems.Report, raw: object, path: str) -> tuple[types.DeviceTaint, ...]:
    result = []
    for i, item in enumerate(common.as_list(o, raw, path, common.MAX_TAINTS)):
        tpath = f"{path}[{i}]"
        t = common.as_map(o, item, tpath, _TAINT_KEYS)
        if t is None:
            continue
        key = common.required_str(o, t, "key", tpath)
        if key:
            common.check(o, f"{tpath}.key", common.label_key(key))
        value = common.as_str(o, t, "value", tpath) or ""
        common.check(o, f"{tpath}.value", common.label_value(value))
        effect = common.required_str(o, t, "effect", tpath, " (NoSchedule, NoExecute or None)")
        if effect and effect not in common.TAINT_EFFECTS:
            o.error(f"{tpath}.effect", f"must be NoSchedule, NoExecute or None, got {common.quote(effect)}")
        result.append(
            types.DeviceTaint(key=key, value=value, effect=effect, time_added=common.as_str(o, t, "timeAdded", tpath))
        )
    return tuple(result)
