"""ResourceClaim and ResourceClaimTemplate: requests (exactly / firstAvailable), constraints, config, status.

What it does: applies the API server's defaults (allocationMode ExactCount, count 1, toleration operator Equal) and
limits, and checks that constraints, configs and allocation results name requests of the same claim. What it must
not do: check that a referenced DeviceClass exists (the allocator reports that). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dractl.model import quantity, types
from dractl.model.decode import common, device_classes, node_selectors, problems, seed_hints

_CLAIM_SPEC_KEYS = frozenset({"devices"})
_DEVICES_KEYS = frozenset({"requests", "constraints", "config"})
_REQUEST_KEYS = frozenset({"name", "exactly", "firstAvailable"})
_INLINE_KEYS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity")
_EXACT_KEYS = frozenset(_INLINE_KEYS)
_REQUEST_OR_INLINE_KEYS = _REQUEST_KEYS | _EXACT_KEYS
_SUBREQUEST_KEYS = frozenset(
    {"name", "deviceClassName", "selectors", "allocationMode", "count", "tolerations", "capacity"}
)
_SUBREQUEST_HINTS = {
    "adminAccess": "not allowed in firstAvailable subrequests: use exactly: {adminAccess: true} on a request"
}
_CONSTRAINT_KEYS = frozenset({"requests", "matchAttribute", "distinctAttribute"})
_CAPACITY_REQUEST_KEYS = frozenset({"requests"})
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


def resource_claim(o: problems.Report, raw: Mapping[str, Any], source: types.Source) -> types.ResourceClaim:
    meta = common.object_meta(o, raw, namespaced=True)
    spec, names = _shared_claim_spec(o, raw.get("spec"))
    allocation, reserved = _claim_status(o, raw.get("status"), names)
    return types.ResourceClaim(meta=meta, spec=spec, allocation=allocation, reserved_for=reserved, source=source)


def plain_claim(raw: Mapping[str, Any], source: types.Source) -> types.ResourceClaim | None:
    """`resource_claim` for a `resource.k8s.io/v1` (or `v1beta2`) claim without status whose
    metadata is a plain valid name and whose spec decoded before without any message (see
    `_shared_claim_spec`), else None. Reads the shared specs; changes nothing.

    The claims of a generated workload look like this by the thousand; the caller then needs
    no problem reporter at all, as nothing here can produce a message."""
    if not raw.keys() <= common.TOP_KEYS:
        return None
    meta = common.plain_object_meta(raw, namespaced=True)
    if meta is None:
        return None
    shared = _SPECS.get((False, repr(raw.get("spec"))))
    if shared is None:
        return None
    return types.ResourceClaim(meta=meta, spec=shared[0], source=source)


# Valid claim specs by their text: generated workloads repeat a handful of specs thousands
# of times, and the values are immutable, so equal specs share one decoded value.
_SPECS: dict[tuple[bool, str], tuple[types.ResourceClaimSpec, RequestNames]] = {}
_MAX_SHARED_SPECS = 4096


def _shared_claim_spec(o: problems.Report, raw: object) -> tuple[types.ResourceClaimSpec, RequestNames]:
    """`_claim_spec(o, raw, "spec")`, shared between equal specs that decode without any problem or warning.

    Pure: a cached value is only ever one that decoding the same text produced without messages.
    """
    # repr() is exact for the plain values parsers produce (it keeps 1, 1.0, True and "1" apart)
    # and far cheaper than sorted JSON; a structure that contains itself prints "..." and is
    # decoded the long way.
    text = repr(raw)
    if "{...}" in text or "[...]" in text:
        return _claim_spec(o, raw, "spec")
    key = (o.beta1, text)
    shared = _SPECS.get(key)
    if shared is not None:
        return shared
    before = (len(o.problems), len(o.warnings))
    decoded = _claim_spec(o, raw, "spec")
    if (len(o.problems), len(o.warnings)) == before:
        if len(_SPECS) >= _MAX_SHARED_SPECS:
            _SPECS.clear()
        _SPECS[key] = decoded
    return decoded


TEMPLATE_SPEC_KEYS = frozenset({"metadata", "spec"})
_TEMPLATE_SPEC_HINTS = {
    key: f"the claim spec of a template goes under spec.spec: write spec: {{spec: {{{key}: ...}}}}"
    for key in ("devices", "requests")
}
_TEMPLATE_META_KEYS = frozenset({"labels", "annotations"})


def resource_claim_template(
    o: problems.Report, raw: Mapping[str, Any], source: types.Source
) -> types.ResourceClaimTemplate:
    meta = common.object_meta(o, raw, namespaced=True)
    spec = common.as_map(o, raw.get("spec"), "spec", TEMPLATE_SPEC_KEYS, _TEMPLATE_SPEC_HINTS)
    if spec is None:
        o.error("spec", "required: write spec: {spec: {devices: {requests: [...]}}}")
        spec = {}
    template_meta = common.as_map(o, spec.get("metadata"), "spec.metadata", _TEMPLATE_META_KEYS) or {}
    labels = common.as_string_map(o, template_meta, "labels", "spec.metadata")
    annotations = common.as_string_map(o, template_meta, "annotations", "spec.metadata")
    claim_spec, _ = _claim_spec(o, spec.get("spec"), "spec.spec")
    return types.ResourceClaimTemplate(
        meta=meta, spec=claim_spec, claim_labels=labels, claim_annotations=annotations, source=source
    )


# Request names of a claim: a request maps to its subrequest names (None for `exactly`).
RequestNames = dict[str, frozenset[str] | None]


def _claim_spec(o: problems.Report, raw: object, path: str) -> tuple[types.ResourceClaimSpec, RequestNames]:
    spec = common.as_map(o, raw, path, _CLAIM_SPEC_KEYS, seed_hints.claim_spec_hints(path)) or {}
    dpath = f"{path}.devices"
    devices = common.as_map(o, spec.get("devices"), dpath, _DEVICES_KEYS) or {}
    requests = []
    names: RequestNames = {}
    for i, item in enumerate(common.as_list(o, devices.get("requests"), f"{dpath}.requests", common.MAX_REQUESTS)):
        rpath = f"{dpath}.requests[{i}]"
        request = _request(o, item, rpath)
        if request is None:
            continue
        if request.name in names:
            o.error(f"{rpath}.name", f"duplicate request name {common.quote(request.name)}")
        names[request.name] = frozenset(s.name for s in request.first_available) if request.first_available else None
        requests.append(request)
    constraints = []
    for i, item in enumerate(
        common.as_list(o, devices.get("constraints"), f"{dpath}.constraints", common.MAX_CONSTRAINTS)
    ):
        constraint = _constraint(o, item, f"{dpath}.constraints[{i}]", names, path)
        if constraint is not None:
            constraints.append(constraint)
    configs = []
    for i, item in enumerate(common.as_list(o, devices.get("config"), f"{dpath}.config", common.MAX_CONFIGS)):
        cpath = f"{dpath}.config[{i}]"
        m = common.as_map(o, item, cpath, device_classes.CLAIM_CONFIG_KEYS)
        if m is not None:
            refs = _request_refs(o, m, cpath, names)
            configs.append(
                types.DeviceClaimConfiguration(requests=refs, opaque=device_classes.opaque_config(o, m, cpath))
            )
    return types.ResourceClaimSpec(
        requests=tuple(requests), constraints=tuple(constraints), config=tuple(configs)
    ), names


def _request(o: problems.Report, raw: object, path: str) -> types.DeviceRequest | None:
    if not isinstance(raw, dict):
        o.error(path, f"must be an object (a YAML mapping), got {common.kind_of(raw)}")
        return None
    inline = [key for key in _INLINE_KEYS if key in raw]
    common.check_keys(o, raw, path, _REQUEST_OR_INLINE_KEYS)
    name = common.required_str(o, raw, "name", path, ' (a DNS label such as "gpu")')
    if name:
        common.check(o, f"{path}.name", common.dns_label(name))
    exactly_raw = raw.get("exactly")
    first_raw = raw.get("firstAvailable")
    exactly: types.ExactDeviceRequest | None = None
    first: tuple[types.DeviceSubRequest, ...] = ()
    if inline:
        fields = ", ".join(inline)
        if not o.beta1:
            are, them = ("is not a field", "it") if len(inline) == 1 else ("are not fields", "them")
            o.error(path, f"{fields} {are} of a resource.k8s.io/v1 request: move {them} under `exactly:`")
        elif first_raw is not None:
            o.error(
                path,
                "exactly one of deviceClassName or firstAvailable is allowed, "
                f"but both are set ({fields}, firstAvailable)",
            )
        if exactly_raw is None and first_raw is None:
            # Decode the inline fields where they are, so later messages point at the user's lines.
            exactly = _exact(o, {key: raw[key] for key in inline}, path)
    if exactly_raw is not None and first_raw is not None:
        o.error(path, "exactly one of `exactly` or `firstAvailable` is allowed, but both are set")
    if exactly_raw is not None:
        m = common.as_map(o, exactly_raw, f"{path}.exactly")
        if m is not None:
            exactly = _exact(o, m, f"{path}.exactly")
    if first_raw is not None:
        first = _first_available(o, first_raw, f"{path}.firstAvailable")
    if not inline and exactly_raw is None and first_raw is None:
        o.error(
            path, "exactly one of `exactly` or `firstAvailable` is required: write exactly: {deviceClassName: <class>}"
        )
    return types.DeviceRequest(name=name, exactly=exactly, first_available=first)


def _exact(o: problems.Report, m: Mapping[str, Any], path: str) -> types.ExactDeviceRequest:
    common.check_keys(o, m, path, _EXACT_KEYS, common.NO_HINTS)
    mode, count = _mode_and_count(o, m, path)
    return types.ExactDeviceRequest(
        device_class_name=_class_name(o, m, path),
        selectors=device_classes.selectors(o, m, path),
        allocation_mode=mode,
        count=count,
        admin_access=common.as_bool(o, m, "adminAccess", path),
        tolerations=_tolerations(o, m, path),
        capacity_requests=_capacity_requests(o, m, path),
    )


def _first_available(o: problems.Report, raw: object, path: str) -> tuple[types.DeviceSubRequest, ...]:
    items = common.as_list(o, raw, path, common.MAX_SUBREQUESTS)
    if raw == []:
        o.error(path, "must not be empty: list the alternatives in order of preference")
    subrequests = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        spath = f"{path}[{i}]"
        m = common.as_map(o, item, spath, _SUBREQUEST_KEYS, _SUBREQUEST_HINTS)
        if m is None:
            continue
        name = common.unique_label(o, m, "name", spath, seen=seen, what="subrequest name")
        mode, count = _mode_and_count(o, m, spath)
        subrequests.append(
            types.DeviceSubRequest(
                name=name,
                device_class_name=_class_name(o, m, spath),
                selectors=device_classes.selectors(o, m, spath),
                allocation_mode=mode,
                count=count,
                tolerations=_tolerations(o, m, spath),
                capacity_requests=_capacity_requests(o, m, spath),
            )
        )
    return tuple(subrequests)


def _class_name(o: problems.Report, m: Mapping[str, Any], path: str) -> str:
    name = common.required_str(o, m, "deviceClassName", path, " (the name of a DeviceClass, e.g. gpu.nvidia.com)")
    if name:
        common.check(o, f"{path}.deviceClassName", common.dns_subdomain(name))
    return name


def _mode_and_count(o: problems.Report, m: Mapping[str, Any], path: str) -> tuple[types.AllocationMode, int]:
    mode_text = common.as_str(o, m, "allocationMode", path) or "ExactCount"
    count = common.as_int(o, m, "count", path)
    if mode_text == "All":
        if count:
            o.error(f"{path}.count", "must be 0 or unset when allocationMode is All")
        return types.AllocationMode.ALL, 0
    if mode_text != "ExactCount":
        o.error(f"{path}.allocationMode", f"must be ExactCount or All, got {common.quote(mode_text)}")
    if count is not None and count < 0:
        o.error(f"{path}.count", "must be >= 1")
    # Like the API server, an explicit 0 in ExactCount mode is defaulted to 1.
    return types.AllocationMode.EXACT_COUNT, count if count else 1


def _tolerations(o: problems.Report, m: Mapping[str, Any], path: str) -> tuple[types.DeviceToleration, ...]:
    base = f"{path}.tolerations"
    result = []
    for i, item in enumerate(common.as_list(o, m.get("tolerations"), base, common.MAX_TOLERATIONS)):
        tpath = f"{base}[{i}]"
        t = common.as_map(o, item, tpath, _TOLERATION_KEYS)
        if t is not None:
            result.append(_toleration(o, t, tpath))
    return tuple(result)


def _toleration(o: problems.Report, t: Mapping[str, Any], path: str) -> types.DeviceToleration:
    key = common.as_str(o, t, "key", path) or ""
    operator = common.as_str(o, t, "operator", path) or "Equal"
    value = common.as_str(o, t, "value", path) or ""
    effect = common.as_str(o, t, "effect", path) or ""
    if key:
        common.check(o, f"{path}.key", common.label_key(key))
    if operator == "Exists":
        if value:
            o.error(f"{path}.value", "must be empty when operator is Exists")
    elif operator == "Equal":
        if not key:
            o.error(
                f"{path}.key", "required unless operator is Exists (an empty key with Exists tolerates every taint)"
            )
        common.check(o, f"{path}.value", common.label_value(value))
    else:
        o.error(f"{path}.operator", f"must be Equal or Exists, got {common.quote(operator)}")
    if effect and effect not in common.TAINT_EFFECTS:
        o.error(f"{path}.effect", f"must be empty, NoSchedule, NoExecute or None, got {common.quote(effect)}")
    return types.DeviceToleration(
        key=key,
        operator=operator,
        value=value,
        effect=effect,
        toleration_seconds=common.as_int(o, t, "tolerationSeconds", path),
    )


def _capacity_requests(o: problems.Report, m: Mapping[str, Any], path: str) -> dict[str, quantity.Quantity]:
    capacity = common.as_map(o, m.get("capacity"), f"{path}.capacity", _CAPACITY_REQUEST_KEYS)
    if capacity is None:
        return {}
    requests = common.as_map(o, capacity.get("requests"), f"{path}.capacity.requests") or {}
    result = {}
    for name, raw in requests.items():
        rpath = f"{path}.capacity.requests[{name}]"
        common.check(o, rpath, common.qualified_name(str(name)))
        result[str(name)] = common.as_quantity(o, raw, rpath)
    return result


def _constraint(
    o: problems.Report, raw: object, path: str, names: RequestNames, spec_path: str
) -> types.DeviceConstraint | None:
    if isinstance(raw, dict) and "cel" in raw:
        o.error(f"{path}.cel", seed_hints.constraint_cel_hint(raw, names, spec_path))
        return None
    m = common.as_map(o, raw, path, _CONSTRAINT_KEYS)
    if m is None:
        return None
    refs = _request_refs(o, m, path, names)
    match = common.as_str(o, m, "matchAttribute", path)
    distinct = common.as_str(o, m, "distinctAttribute", path)
    if match is not None and distinct is not None:
        o.error(path, "exactly one of matchAttribute or distinctAttribute is allowed, but both are set")
    elif match is None and distinct is None:
        o.error(
            path,
            "exactly one of matchAttribute or distinctAttribute is required, e.g. matchAttribute: "
            "gpu.nvidia.com/parentUUID",
        )
    for key, value in (("matchAttribute", match), ("distinctAttribute", distinct)):
        if value is not None:
            common.check(o, f"{path}.{key}", common.fully_qualified_name(value))
    return types.DeviceConstraint(requests=refs, match_attribute=match, distinct_attribute=distinct)


def _request_refs(o: problems.Report, m: Mapping[str, Any], path: str, names: RequestNames) -> tuple[str, ...]:
    refs = common.as_strings(o, m, "requests", path, common.MAX_REQUEST_REFS)
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        rpath = f"{path}.requests[{i}]"
        if ref in seen:
            o.error(rpath, f"duplicate request {common.quote(ref)}")
        seen.add(ref)
        if not _has_request(names, ref):
            known = ", ".join(_all_refs(names)) or "none"
            o.error(
                rpath,
                f"{common.quote(ref)} is not a request of this claim (requests: {known}; a subrequest is written "
                "request/subrequest)",
            )
    return refs


def _has_request(names: RequestNames, ref: str) -> bool:
    request, slash, sub = ref.partition("/")
    if request not in names:
        return False
    if not slash:
        return True
    subs = names[request]
    return subs is not None and sub in subs


def _all_refs(names: RequestNames) -> list[str]:
    refs = []
    for request, subs in names.items():
        refs.append(request)
        refs.extend(f"{request}/{sub}" for sub in sorted(subs or ()))
    return refs


_STATUS_KEYS = frozenset({"allocation", "reservedFor", "devices"})
_ALLOCATION_KEYS = frozenset({"devices", "nodeSelector", "allocationTimestamp"})
_RESULT_KEYS = frozenset(
    {
        "request",
        "driver",
        "pool",
        "device",
        "adminAccess",
        "tolerations",
        "bindingConditions",
        "bindingFailureConditions",
        "shareID",
        "consumedCapacity",
    }
)
_ALLOCATION_DEVICES_KEYS = frozenset({"results", "config"})
_ALLOCATION_CONFIG_KEYS = frozenset({"source", "requests", "opaque"})
_CONSUMER_KEYS = frozenset({"apiGroup", "resource", "name", "uid"})


def _claim_status(
    o: problems.Report, raw: object, names: RequestNames
) -> tuple[types.AllocationResult | None, tuple[types.ResourceClaimConsumerReference, ...]]:
    if raw is None:
        return None, ()  # the common case: a claim not yet allocated
    status = common.as_map(o, raw, "status", _STATUS_KEYS) or {}
    allocation = None
    a = common.as_map(o, status.get("allocation"), "status.allocation", _ALLOCATION_KEYS)
    if a is not None:
        allocation = _allocation(o, a, "status.allocation", names)
    reserved = []
    uids: set[str] = set()
    for i, item in enumerate(
        common.as_list(o, status.get("reservedFor"), "status.reservedFor", common.MAX_RESERVED_FOR)
    ):
        rpath = f"status.reservedFor[{i}]"
        r = common.as_map(o, item, rpath, _CONSUMER_KEYS)
        if r is None:
            continue
        uid = common.required_str(o, r, "uid", rpath)
        if uid in uids:
            o.error(f"{rpath}.uid", f"duplicate consumer uid {common.quote(uid)}")
        uids.add(uid)
        reserved.append(
            types.ResourceClaimConsumerReference(
                api_group=common.as_str(o, r, "apiGroup", rpath) or "",
                resource=common.required_str(o, r, "resource", rpath, " (e.g. pods)"),
                name=common.required_str(o, r, "name", rpath),
                uid=uid,
            )
        )
    if reserved and allocation is None:
        o.error("status.reservedFor", "must be empty while status.allocation is not set")
    return allocation, tuple(reserved)


def _allocation(o: problems.Report, a: Mapping[str, Any], path: str, names: RequestNames) -> types.AllocationResult:
    devices = common.as_map(o, a.get("devices"), f"{path}.devices", _ALLOCATION_DEVICES_KEYS) or {}
    results = []
    for i, item in enumerate(common.as_list(o, devices.get("results"), f"{path}.devices.results", common.MAX_RESULTS)):
        rpath = f"{path}.devices.results[{i}]"
        r = common.as_map(o, item, rpath, _RESULT_KEYS)
        if r is not None:
            results.append(_result(o, r, rpath, names))
    configs = []
    for i, item in enumerate(
        common.as_list(o, devices.get("config"), f"{path}.devices.config", common.MAX_ALLOCATION_CONFIGS)
    ):
        cpath = f"{path}.devices.config[{i}]"
        c = common.as_map(o, item, cpath, _ALLOCATION_CONFIG_KEYS)
        if c is None:
            continue
        source = common.required_str(o, c, "source", cpath, " (FromClass or FromClaim)")
        if source and source not in ("FromClass", "FromClaim"):
            o.error(f"{cpath}.source", f"must be FromClass or FromClaim, got {common.quote(source)}")
        configs.append(
            types.DeviceAllocationConfiguration(
                source=source,
                requests=_request_refs(o, c, cpath, names),
                opaque=device_classes.opaque_config(o, c, cpath),
            )
        )
    selector = None
    if a.get("nodeSelector") is not None:
        selector = node_selectors.node_selector(o, a["nodeSelector"], f"{path}.nodeSelector")
    return types.AllocationResult(
        results=tuple(results),
        config=tuple(configs),
        node_selector=selector,
        allocation_timestamp=common.as_str(o, a, "allocationTimestamp", path),
    )


def _result(
    o: problems.Report, r: Mapping[str, Any], path: str, names: RequestNames
) -> types.DeviceRequestAllocationResult:
    request = common.required_str(o, r, "request", path)
    if request and not _has_request(names, request):
        o.error(
            f"{path}.request",
            f"{common.quote(request)} is not a request of this claim (requests: "
            f"{', '.join(_all_refs(names)) or 'none'})",
        )
    driver = common.required_str(o, r, "driver", path)
    if driver:
        common.check(o, f"{path}.driver", common.driver_name(driver))
    pool = common.required_str(o, r, "pool", path)
    if pool:
        common.check(o, f"{path}.pool", common.pool_name(pool))
    device = common.required_str(o, r, "device", path)
    if device:
        common.check(o, f"{path}.device", common.dns_label(device))
    share_id = common.as_str(o, r, "shareID", path)
    if share_id is not None and not common.UUID.match(share_id):
        o.error(f"{path}.shareID", f"{common.quote(share_id)} must be a lowercase RFC 4122 UUID")
    consumed = {}
    for name, raw in (common.as_map(o, r.get("consumedCapacity"), f"{path}.consumedCapacity") or {}).items():
        cpath = f"{path}.consumedCapacity[{name}]"
        common.check(o, cpath, common.qualified_name(str(name)))
        consumed[str(name)] = common.as_quantity(o, raw, cpath)
    conditions, failures = common.binding_conditions(o, r, path)
    admin = common.as_bool(o, r, "adminAccess", path)
    return types.DeviceRequestAllocationResult(
        request=request,
        driver=driver,
        pool=pool,
        device=device,
        admin_access=True if admin else None,
        tolerations=_tolerations(o, r, path),
        binding_conditions=conditions,
        binding_failure_conditions=failures,
        share_id=share_id,
        consumed_capacity=consumed,
    )
