""" "Write instead" hints for patterns from older articles (the seeds) that the v1 API rejects.

What it does: turns removed `v1alpha2` kinds and fields, label-selector style selectors, CEL constraints, plain
attribute values, `source:` in pod claims and inline templates into one message naming what to write instead.
What it must not do: decide whether input is valid (the callers do; these only phrase the message). Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from dractl.model.decode import common, problems, resource_claims

REMOVED_KINDS = frozenset(
    {"ResourceClass", "ResourceClaimParameters", "ResourceClassParameters", "PodSchedulingContext"}
)
ALPHA3_CHANGES = {
    "DeviceClass": " (spec.selectors[].cel.expression keeps its shape)",
    "ResourceClaim": ", where each request's deviceClassName, selectors, "
    "count and allocationMode move under `exactly:`",
    "ResourceClaimTemplate": ", where each request's deviceClassName, selectors, "
    "count and allocationMode move under `exactly:`",
    "ResourceSlice": (
        ", where the `basic:` wrapper of devices is gone (attributes and capacity sit on the device), "
        'attributes take typed values such as {string: "..."}, {int: ...}, {version: "..."}, '
        "and capacity entries are {value: <quantity>}"
    ),
}
NO_CLAIM_PARAMETERS = (
    "claim parameters objects are gone from DRA: express the requirements as CEL in "
    "{path}.devices.requests[].exactly.selectors[].cel.expression, "
    'e.g. device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("16Gi")) >= 0'
)


def removed_alpha2(o: problems.Report, raw: Mapping[str, Any], kind: str, version: str) -> None:
    """Objects of the removed `v1alpha2` API (classic DRA): say what replaces each part."""
    if kind in REMOVED_KINDS:
        gone = f"{kind} was removed from Kubernetes together with resource.k8s.io/v1alpha2"
    else:
        gone = f"resource.k8s.io/{version} is no longer served"
    if kind == "ResourceClass":
        driver = raw.get("driverName")
        driver = driver if isinstance(driver, str) and driver else common.NVIDIA_DOMAIN
        o.error(
            "apiVersion",
            f"{gone}: write a resource.k8s.io/v1 DeviceClass with spec.selectors[].cel.expression, e.g. `device.driver "
            f'== "{driver}"`',
        )
        if "driverName" in raw:
            selector = f"[{{cel: {{expression: 'device.driver == \"{driver}\"'}}}}]"
            o.error(
                "driverName", f"DeviceClass has no driverName: select the driver in CEL: spec.selectors: {selector}"
            )
        if "structuredParameters" in raw:
            o.error(
                "structuredParameters",
                "removed: every v1 driver publishes its devices in ResourceSlices; delete this field",
            )
        if "suitableNodes" in raw:
            o.error(
                "suitableNodes",
                "removed: nodes come from the driver's ResourceSlices; select devices with "
                "spec.selectors[].cel.expression",
            )
        if "parametersRef" in raw:
            o.error(
                "parametersRef",
                "removed: put driver configuration in the DeviceClass's spec.config[].opaque {driver, parameters}",
            )
        return
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        path = "spec.spec" if kind == "ResourceClaimTemplate" else "spec"
        o.error(
            "apiVersion",
            f"{gone}: write apiVersion: "
            f"resource.k8s.io/v1 with {path}.devices.requests[].exactly.deviceClassName and CEL selectors",
        )
        spec = raw.get("spec")
        if kind == "ResourceClaimTemplate" and isinstance(spec, dict):
            spec = spec.get("spec")
        if isinstance(spec, dict):
            _alpha2_claim_spec(o, spec, path)
        return
    if kind in ("ResourceClaimParameters", "ResourceClassParameters"):
        o.error("apiVersion", f"{gone}: {NO_CLAIM_PARAMETERS.format(path='the claim spec')}")
        return
    o.error(
        "apiVersion",
        f"{gone}: DRA objects are resource.k8s.io/v1 DeviceClass, ResourceClaim, "
        "ResourceClaimTemplate and ResourceSlice",
    )


def _alpha2_claim_spec(o: problems.Report, spec: Mapping[str, Any], path: str) -> None:
    class_name = spec.get("resourceClassName")
    if "resourceClassName" in spec:
        shown = class_name if isinstance(class_name, str) and class_name else "<class>"
        requests = f"[{{name: gpu, exactly: {{deviceClassName: {shown}}}}}]"
        o.error(f"{path}.resourceClassName", f"removed: write {path}.devices.requests: {requests} naming a DeviceClass")
    for key in ("parametersRef", "parameters"):
        if key in spec:
            o.error(f"{path}.{key}", NO_CLAIM_PARAMETERS.format(path=path))
    if "allocationMode" in spec:
        o.error(
            f"{path}.allocationMode",
            "removed: v1 claims are allocated when the first pod using them is scheduled; delete this field",
        )


def label_selector_hint(item: Mapping[str, Any]) -> str:
    """Label-selector style (`key`/`operator`/`values`) selectors from old articles, as CEL."""
    key = str(item.get("key", "memory"))
    operator = str(item.get("operator", "In"))
    raw_values = item.get("values")
    values: list[Any] = raw_values if isinstance(raw_values, list) else []
    first = str(values[0]) if values else "..."
    comparisons = {"Gt": ">", "Lt": "<", "Ge": ">=", "Le": "<="}
    if key == "memory" and operator in comparisons:
        amount = f"{first}Mi" if first.isdigit() else first
        expression = (
            f'device.capacity["{common.NVIDIA_DOMAIN}"].memory.compareTo(quantity("{amount}")) '
            f"{comparisons[operator]} 0"
        )
    else:
        field = (
            f'device.attributes["{common.NVIDIA_DOMAIN}"].{key}'
            if common.C_IDENTIFIER.match(key)
            else f'device.attributes["{common.NVIDIA_DOMAIN}"]["{key}"]'
        )
        if operator in comparisons:
            expression = f"{field} {comparisons[operator]} {first}"
        elif operator in ("Exists", "DoesNotExist"):
            test = f'"{key}" in device.attributes["{common.NVIDIA_DOMAIN}"]'
            expression = test if operator == "Exists" else f"!({test})"
        else:
            listed = ", ".join(common.quote(str(v)) for v in values)
            expression = f"{field} in [{listed}]" if operator == "In" else f"!({field} in [{listed}])"
    return f"selectors take CEL, not key/operator/values: write - cel: {{expression: '{expression}'}}"


@functools.lru_cache(maxsize=4)
def claim_spec_hints(path: str) -> Mapping[str, str]:
    return {
        "resourceClassName": "removed with resource.k8s.io/v1alpha2: name a DeviceClass in "
        f"{path}.devices.requests[].exactly.deviceClassName",
        "parametersRef": NO_CLAIM_PARAMETERS.format(path=path),
        "parameters": NO_CLAIM_PARAMETERS.format(path=path),
        "requests": "requests go under devices: write devices: {requests: [...]}",
        "constraints": "constraints go under devices: write devices: {constraints: [...]}",
        "config": "config goes under devices: write devices: {config: [...]}",
    }


def constraint_cel_hint(raw: Mapping[str, Any], names: resource_claims.RequestNames, spec_path: str) -> str:
    """Constraints with `cel:` (seed 003): say which request's selectors take the expression."""
    listed = raw.get("requests")
    targets: list[Any] = listed if isinstance(listed, list) else list(names)
    indexes = [i for i, name in enumerate(names) if name in targets]
    where = f"{spec_path}.devices.requests[{indexes[0]}]" if len(indexes) == 1 else f"{spec_path}.devices.requests[]"
    return (
        "constraints only support matchAttribute and distinctAttribute: put the expression under the "
        f"request's selectors, {where}.exactly.selectors: [{{cel: {{expression: ...}}}}]"
    )


_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGTPE])(i?)B?\Z")
_VERSIONISH = re.compile(r"v?[0-9]+(\.[0-9]+){0,2}\Z")


def plain_attribute_hint(name: str, value: object) -> str:
    """Attributes written as plain scalars (`memory: "24GB"`): say which typed value to write."""
    shown = common.quote(value) if isinstance(value, str) else common.yaml_scalar(value)
    text = value if isinstance(value, str) else ""
    if "/" not in name and common.qualified_name(name) is not None:
        name = common.identifier_suggestion(name) or name
    size = _SIZE.match(text)
    if size:
        number, prefix, binary = size.groups()
        capacity = f"{number}{prefix}{binary}" if binary or prefix != "K" else f"{number}k"
        return (
            f"{shown} is a plain value; a size belongs in the device's capacity: {name}: {{value: {capacity}}} (or "
            f"write {name}: {{string: {shown}}})"
        )
    if isinstance(value, bool):
        typed = f"{{bool: {shown}}}"
    elif isinstance(value, int):
        typed = f"{{int: {shown}}}"
    elif text.isdigit():
        typed = f"{{int: {text}}}"
    elif _VERSIONISH.match(text):
        parts = text.lstrip("v").split(".")
        typed = f'{{version: "{".".join(parts + ["0"] * (3 - len(parts)))}"}}'
    elif isinstance(value, str):
        typed = f"{{string: {shown}}}"
    else:
        return (
            "must be a typed value such as {string: ...}, {int: ...}, {bool: ...} or {version: ...}, got "
            f"{common.kind_of(value)}"
        )
    return (
        f"{shown} is a plain value; attributes are typed: write {name}: {typed} ({{string: ...}}, {{int: ...}}, "
        "{bool: ...} or {version: ...})"
    )


def claim_source_hint(source: object) -> str:
    """`resourceClaims[].source` from 1.26-1.30 era articles."""
    if isinstance(source, dict):
        for key in ("resourceClaimName", "resourceClaimTemplateName"):
            if isinstance(source.get(key), str):
                return f"source: was removed from the Pod API: write {key}: {source[key]} directly on the entry"
    return (
        "source: was removed from the Pod API: "
        "write resourceClaimName or resourceClaimTemplateName directly on the entry"
    )


def inline_templates_hint(raw: object, path: str) -> str:
    """`resourceClaimTemplates:` inside a pod spec (seed 003): pods only reference templates."""
    name = "<name>"
    if isinstance(raw, list) and raw and isinstance(raw[0], dict):
        meta = raw[0].get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            name = meta["name"]
    return (
        "not a Pod field: create a resource.k8s.io/v1 ResourceClaimTemplate object named "
        f"{name} and reference it with {path}.resourceClaims: [{{name: {name}, resourceClaimTemplateName: {name}}}]"
    )
