"""DeviceClass, and the selectors and opaque configurations that claims share with it.

What it must not do: compile CEL (`dractl.cel` does; only empty and over-long expressions are refused here). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dractl.model import types
from dractl.model.decode import common, problems, seed_hints

_CLASS_SPEC_KEYS = frozenset({"selectors", "config", "extendedResourceName"})
CLASS_TOP_HINTS = {
    "driverName": "DeviceClass has no driverName: select the driver with spec.selectors: [{cel: {expression: "
    "'device.driver == \"gpu.nvidia.com\"'}}]",
}
_CLASS_SPEC_HINTS = {
    "driverName": CLASS_TOP_HINTS["driverName"],
    "suitableNodes": "not a DeviceClass field: nodes come from the driver's ResourceSlices",
    "parametersRef": "not a DeviceClass field: put driver configuration in spec.config[].opaque {driver, parameters}",
}


def device_class(o: problems.Report, raw: Mapping[str, Any], source: types.Source) -> types.DeviceClass:
    meta = common.object_meta(o, raw, namespaced=False)
    spec = common.as_map(o, raw.get("spec"), "spec", _CLASS_SPEC_KEYS, _CLASS_SPEC_HINTS) or {}
    configs = []
    for i, item in enumerate(common.as_list(o, spec.get("config"), "spec.config", common.MAX_CONFIGS)):
        path = f"spec.config[{i}]"
        m = common.as_map(o, item, path, _CONFIG_KEYS)
        if m is not None:
            configs.append(opaque_config(o, m, path))
    extended = common.as_str(o, spec, "extendedResourceName", "spec")
    if extended is not None:
        common.check(o, "spec.extendedResourceName", common.extended_resource_name(extended))
    return types.DeviceClass(
        meta=meta,
        selectors=selectors(o, spec, "spec"),
        config=tuple(configs),
        extended_resource_name=extended,
        source=source,
    )


_SELECTOR_KEYS = frozenset({"cel"})
_CEL_KEYS = frozenset({"expression"})
_SELECTOR_HINTS = {"expression": "the expression goes under cel: write - cel: {expression: ...}"}
_CONFIG_KEYS = frozenset({"opaque"})
CLAIM_CONFIG_KEYS = frozenset({"requests", "opaque"})
_OPAQUE_KEYS = frozenset({"driver", "parameters"})


def selectors(o: problems.Report, m: Mapping[str, Any], path: str) -> tuple[str, ...]:
    expressions = []
    base = common.join(path, "selectors")
    for i, item in enumerate(common.as_list(o, m.get("selectors"), base, common.MAX_SELECTORS)):
        spath = f"{base}[{i}]"
        if isinstance(item, dict) and "cel" not in item and ("key" in item or "operator" in item):
            o.error(spath, seed_hints.label_selector_hint(item))
            continue
        selector = common.as_map(o, item, spath, _SELECTOR_KEYS, _SELECTOR_HINTS)
        if selector is None:
            continue
        cel = common.as_map(o, selector.get("cel"), f"{spath}.cel", _CEL_KEYS)
        if cel is None:
            if selector.get("cel") is None:
                o.error(f"{spath}.cel", "required: write - cel: {expression: ...}")
            continue
        expression = common.as_str(o, cel, "expression", f"{spath}.cel") or ""
        if not expression.strip():
            o.error(f"{spath}.cel.expression", 'required (a CEL expression such as device.driver == "gpu.nvidia.com")')
        elif len(expression) > common.MAX_CEL_BYTES // 4 and len(expression.encode()) > common.MAX_CEL_BYTES:
            o.error(
                f"{spath}.cel.expression",
                f"must be at most {common.MAX_CEL_BYTES} bytes, got {len(expression.encode())}",
            )
        expressions.append(expression)
    return tuple(expressions)


def opaque_config(o: problems.Report, m: Mapping[str, Any], path: str) -> types.OpaqueDeviceConfiguration:
    opaque = common.as_map(o, m.get("opaque"), f"{path}.opaque", _OPAQUE_KEYS)
    if opaque is None:
        if m.get("opaque") is None:
            o.error(f"{path}.opaque", "required: write opaque: {driver: gpu.nvidia.com, parameters: {...}}")
        return types.OpaqueDeviceConfiguration(driver="", parameters={})
    opath = f"{path}.opaque"
    driver = common.required_str(o, opaque, "driver", opath)
    if driver:
        common.check(o, f"{opath}.driver", common.driver_name(driver))
    parameters = opaque.get("parameters")
    if parameters is None:
        o.error(f"{opath}.parameters", "required (a JSON object for the driver)")
    elif not isinstance(parameters, dict):
        o.error(f"{opath}.parameters", f"must be a JSON object, got {common.kind_of(parameters)}")
    else:
        try:
            size = len(json.dumps(parameters, separators=(",", ":"), default=str).encode())
        except ValueError:
            o.error(f"{opath}.parameters", "must not contain itself (a YAML alias to an enclosing value)")
        else:
            if size > common.MAX_OPAQUE_BYTES:
                o.error(f"{opath}.parameters", f"must be at most {common.MAX_OPAQUE_BYTES} bytes of JSON, got {size}")
    return types.OpaqueDeviceConfiguration(driver=driver, parameters=parameters)
