"""Encode model values into the exact JSON shape of `resource.k8s.io/v1` objects.

What it does: turns a `ResourceClaim` (spec, `status.allocation`, `status.reservedFor`), an
`AllocationResult` or a `ResourceSlice` into plain dicts, lists, strings, ints and bools, omitting
empty and unset fields the way the API server's JSON does (`omitempty`), so the output can be printed as
YAML/JSON or sent as a patch. Quantities keep their spelling.

What it must not do: validate (values come from `decode` or the allocator), do I/O, or
add fields the API does not have. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dractl.model import quantity, semver, types


def resource_claim(claim: types.ResourceClaim) -> dict[str, Any]:
    """The claim as the API server would return it. Pure; equal claims give equal dicts."""
    status: dict[str, Any] = {}
    if claim.allocation is not None:
        status["allocation"] = allocation_result(claim.allocation)
    if claim.reserved_for:
        status["reservedFor"] = [_consumer(ref) for ref in claim.reserved_for]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": _meta(claim.meta),
        "spec": _claim_spec(claim.spec),
        "status": status,
    }


def allocation_result(a: types.AllocationResult) -> dict[str, Any]:
    """`status.allocation` of a claim: devices.results, devices.config, nodeSelector. Pure."""
    devices: dict[str, Any] = {}
    if a.results:
        devices["results"] = [_result(r) for r in a.results]
    if a.config:
        devices["config"] = [_allocation_config(c) for c in a.config]
    out: dict[str, Any] = {"devices": devices}
    if a.node_selector is not None:
        out["nodeSelector"] = _node_selector(a.node_selector)
    if a.allocation_timestamp is not None:
        out["allocationTimestamp"] = a.allocation_timestamp
    return out


def _omit_empty(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Drop None, "" and empty lists and maps, as Go's `omitempty` does for pointers, strings and slices.

    False and 0 are kept: a `*bool` set to false is written by the API server too. Callers map
    the int zero values the API omits (`count` in All mode, `generation`) to None.
    """
    return {
        key: value for key, value in fields.items() if value is not None and value != "" and value != [] and value != {}
    }


def _meta(meta: types.ObjectMeta) -> dict[str, Any]:
    return _omit_empty(
        {
            "name": meta.name,
            "generateName": meta.generate_name,
            "namespace": meta.namespace,
            "uid": meta.uid,
            "resourceVersion": meta.resource_version,
            "generation": meta.generation or None,
            "deletionTimestamp": meta.deletion_timestamp,
            "labels": dict(meta.labels),
            "annotations": dict(meta.annotations),
            "ownerReferences": [dict(owner) for owner in meta.owner_references],
            "finalizers": list(meta.finalizers),
        }
    )


def _quantities(values: Mapping[str, quantity.Quantity]) -> dict[str, str]:
    return {name: str(value) for name, value in values.items()}


def _claim_spec(spec: types.ResourceClaimSpec) -> dict[str, Any]:
    return {
        "devices": _omit_empty(
            {
                "requests": [_request(r) for r in spec.requests],
                "constraints": [_constraint(c) for c in spec.constraints],
                "config": [
                    _omit_empty({"requests": list(c.requests), "opaque": _opaque(c.opaque)}) for c in spec.config
                ],
            }
        )
    }


def _request(request: types.DeviceRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"name": request.name}
    if request.exactly is not None:
        out["exactly"] = _class_request(request.exactly)
    if request.first_available:
        out["firstAvailable"] = [_class_request(s) for s in request.first_available]
    return out


def _class_request(r: types.ExactDeviceRequest | types.DeviceSubRequest) -> dict[str, Any]:
    """`exactly`, or one `firstAvailable` entry: the same fields, but for the entry's name and `exactly`'s
    adminAccess, in the API's order."""
    return _omit_empty(
        {
            "name": r.name if isinstance(r, types.DeviceSubRequest) else None,
            "deviceClassName": r.device_class_name,
            "selectors": _selectors(r.selectors),
            "allocationMode": r.allocation_mode.value,
            "count": r.count or None,
            "adminAccess": r.admin_access if isinstance(r, types.ExactDeviceRequest) else None,
            "tolerations": [_toleration(t) for t in r.tolerations],
            "capacity": {"requests": _quantities(r.capacity_requests)} if r.capacity_requests else None,
        }
    )


def _selectors(expressions: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"cel": {"expression": expression}} for expression in expressions]


def _toleration(t: types.DeviceToleration) -> dict[str, Any]:
    return _omit_empty(
        {
            "key": t.key,
            "operator": t.operator,
            "value": t.value,
            "effect": t.effect,
            "tolerationSeconds": t.toleration_seconds,
        }
    )


def _constraint(c: types.DeviceConstraint) -> dict[str, Any]:
    return _omit_empty(
        {
            "requests": list(c.requests),
            "matchAttribute": c.match_attribute,
            "distinctAttribute": c.distinct_attribute,
        }
    )


def _opaque(opaque: types.OpaqueDeviceConfiguration) -> dict[str, Any]:
    return {"driver": opaque.driver, "parameters": opaque.parameters}


def _result(r: types.DeviceRequestAllocationResult) -> dict[str, Any]:
    return _omit_empty(
        {
            "request": r.request,
            "driver": r.driver,
            "pool": r.pool,
            "device": r.device,
            "adminAccess": True if r.admin_access else None,
            "tolerations": [_toleration(t) for t in r.tolerations],
            "bindingConditions": list(r.binding_conditions),
            "bindingFailureConditions": list(r.binding_failure_conditions),
            "shareID": r.share_id,
            "consumedCapacity": _quantities(r.consumed_capacity),
        }
    )


def _allocation_config(c: types.DeviceAllocationConfiguration) -> dict[str, Any]:
    return _omit_empty({"source": c.source, "requests": list(c.requests), "opaque": _opaque(c.opaque)})


def _node_selector(selector: types.NodeSelector) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            _omit_empty(
                {
                    "matchExpressions": [_requirement(r) for r in term.match_expressions],
                    "matchFields": [_requirement(r) for r in term.match_fields],
                }
            )
            for term in selector.terms
        ]
    }


def _requirement(r: types.NodeSelectorRequirement) -> dict[str, Any]:
    return _omit_empty({"key": r.key, "operator": r.operator, "values": list(r.values)})


def _consumer(ref: types.ResourceClaimConsumerReference) -> dict[str, Any]:
    return _omit_empty({"apiGroup": ref.api_group, "resource": ref.resource, "name": ref.name, "uid": ref.uid})


# --- ResourceSlice ---------------------------------------------------------------------------


def resource_slice(s: types.ResourceSlice) -> dict[str, Any]:
    """The slice as the API server would return it (`resource.k8s.io/v1`). Pure.

    `pool.generation` and `pool.resourceSliceCount` are always written (the API has no
    omitempty on them); the `*bool` fields are written only when true, as dractl never
    sets them to false. Attribute, capacity and counter maps keep their insertion order.
    """
    spec: dict[str, Any] = {
        "driver": s.driver,
        "pool": {
            "name": s.pool.name,
            "generation": s.pool.generation,
            "resourceSliceCount": s.pool.resource_slice_count,
        },
    }
    spec.update(
        _omit_empty(
            {
                "nodeName": s.node_name,
                "nodeSelector": _node_selector(s.node_selector) if s.node_selector is not None else None,
                "allNodes": True if s.all_nodes else None,
                "perDeviceNodeSelection": True if s.per_device_node_selection else None,
                "devices": [_device(d) for d in s.devices],
                "sharedCounters": [{"name": c.name, "counters": _counters(c.counters)} for c in s.shared_counters],
            }
        )
    )
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": _meta(s.meta), "spec": spec}


def device_attribute(a: types.DeviceAttribute) -> dict[str, Any]:
    """One typed attribute value: `{string: ...}`, `{version: ...}`, or the list forms. Pure."""
    texts = a.texts if a.kind is types.AttributeKind.VERSION and a.texts else None
    values: list[Any] = list(texts) if texts else [str(v) if isinstance(v, semver.Semver) else v for v in a.values]
    if a.is_list:
        return {f"{a.kind.value}s": values}
    return {a.kind.value: values[0]}


def _device(d: types.Device) -> dict[str, Any]:
    return _omit_empty(
        {
            "name": d.name,
            "attributes": {name: device_attribute(a) for name, a in d.attributes.items()},
            "capacity": {name: _capacity(c) for name, c in d.capacity.items()},
            "consumesCounters": [
                {"counterSet": c.counter_set, "counters": _counters(c.counters)} for c in d.consumes_counters
            ],
            "nodeName": d.node_name,
            "nodeSelector": _node_selector(d.node_selector) if d.node_selector is not None else None,
            "allNodes": True if d.all_nodes else None,
            "taints": [_taint(t) for t in d.taints],
            "bindsToNode": True if d.binds_to_node else None,
            "bindingConditions": list(d.binding_conditions),
            "bindingFailureConditions": list(d.binding_failure_conditions),
            "allowMultipleAllocations": True if d.allow_multiple_allocations else None,
        }
    )


def _capacity(c: types.DeviceCapacity) -> dict[str, Any]:
    out: dict[str, Any] = {"value": str(c.value)}
    p = c.request_policy
    if p is not None:
        out["requestPolicy"] = _omit_empty(
            {
                "default": str(p.default) if p.default is not None else None,
                "validValues": [str(v) for v in p.valid_values],
                "validRange": _omit_empty(
                    {
                        "min": str(p.valid_range.min),
                        "max": str(p.valid_range.max) if p.valid_range.max is not None else None,
                        "step": str(p.valid_range.step) if p.valid_range.step is not None else None,
                    }
                )
                if p.valid_range is not None
                else None,
            }
        )
    return out


def _counters(counters: Mapping[str, quantity.Quantity]) -> dict[str, dict[str, str]]:
    return {name: {"value": str(value)} for name, value in counters.items()}


def _taint(t: types.DeviceTaint) -> dict[str, Any]:
    return _omit_empty({"key": t.key, "value": t.value, "effect": t.effect, "timeAdded": t.time_added})
