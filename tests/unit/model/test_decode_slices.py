"""Validation of ResourceSlices: node selection, pools, devices, attributes, capacity, counters, taints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import model_manifests as m

from dractl.model import decode

PREFIX = "slices.yaml: ResourceSlice node-1-gpu: "
DEV = "spec.devices[0]"


def _attrs(**attributes: Any) -> dict[str, Any]:
    return m.resource_slice(m.device(attributes=attributes))


def _capacity(allow: bool = True, **capacity: Any) -> dict[str, Any]:
    return m.resource_slice(m.device(capacity=capacity, allowMultipleAllocations=allow))


def _without(key: str, **spec: Any) -> dict[str, Any]:
    result = m.resource_slice(**spec)
    del result["spec"][key]
    return result


def _policy(**policy: Any) -> dict[str, Any]:
    return _capacity(memory={"value": "80Gi", "requestPolicy": policy})


POLICY = f"{DEV}.capacity[memory].requestPolicy"
DNS_LABEL = (
    "is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
)

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "no-node-selection",
        _without("nodeName"),
        [
            "spec: exactly one of nodeName, nodeSelector, "
            "allNodes or perDeviceNodeSelection is required, e.g. nodeName: <node>"
        ],
    ),
    (
        "two-node-selections",
        m.resource_slice(allNodes=True),
        [
            "spec: exactly one of nodeName, nodeSelector, allNodes or perDeviceNodeSelection is allowed, "
            "but nodeName, allNodes are set"
        ],
    ),
    (
        "all-nodes-false",
        _without("nodeName", allNodes=False),
        [
            "spec.allNodes: must be unset or true",
            "spec: exactly one of nodeName, nodeSelector, "
            "allNodes or perDeviceNodeSelection is required, e.g. nodeName: <node>",
        ],
    ),
    (
        "empty-node-name",
        m.resource_slice(nodeName=""),
        [
            "spec.nodeName: must be unset or a node name",
            "spec: exactly one of nodeName, nodeSelector, "
            "allNodes or perDeviceNodeSelection is required, e.g. nodeName: <node>",
        ],
    ),
    (
        "two-selector-terms",
        _without(
            "nodeName",
            nodeSelector={
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                    {"matchExpressions": [{"key": "b", "operator": "Exists"}]},
                ]
            },
        ),
        ["spec.nodeSelector.nodeSelectorTerms: must have exactly one node selector term"],
    ),
    (
        "selector-in-without-values",
        _without(
            "nodeName", nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]}
        ),
        ["spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values: required for operator In"],
    ),
    (
        "selector-bad-operator",
        _without(
            "nodeName", nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Equals"}]}]}
        ),
        [
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator: must be one of In, NotIn, Exists, "
            'DoesNotExist, Gt, Lt, got "Equals"'
        ],
    ),
    ("no-driver", _without("driver"), ["spec.driver: required (the DRA driver's name, e.g. gpu.nvidia.com)"]),
    (
        "bad-driver",
        m.resource_slice(driver="nvidia.com/gpu"),
        [
            'spec.driver: "nvidia.com/gpu" is not a driver name: a DNS subdomain of at most 63 characters such as '
            '"gpu.nvidia.com"'
        ],
    ),
    ("no-pool", _without("pool"), ["spec.pool: required: write pool: {name: <node name>, resourceSliceCount: 1}"]),
    (
        "no-slice-count",
        m.resource_slice(pool={"name": "node-1"}),
        ["spec.pool.resourceSliceCount: required: the number of slices in this pool, usually 1"],
    ),
    (
        "null-slice-count",
        m.resource_slice(pool={"name": "node-1", "resourceSliceCount": None}),
        ["spec.pool.resourceSliceCount: required: the number of slices in this pool, usually 1"],
    ),
    (
        "zero-slice-count",
        m.resource_slice(pool={"name": "node-1", "resourceSliceCount": 0}),
        ["spec.pool.resourceSliceCount: must be >= 1"],
    ),
    (
        "negative-generation",
        m.resource_slice(pool={"name": "node-1", "generation": -1, "resourceSliceCount": 1}),
        ["spec.pool.generation: must be >= 0"],
    ),
    (
        "bad-pool-name",
        m.resource_slice(pool={"name": "Node_1", "resourceSliceCount": 1}),
        ["spec.pool.name: \"Node_1\" is not a pool name: DNS subdomains separated by '/', at most 253 characters"],
    ),
    (
        "devices-and-counters",
        m.resource_slice(sharedCounters=[{"name": "c", "counters": {"memory": {"value": 1}}}]),
        ["spec: only one of devices or sharedCounters is allowed: publish counter sets in a slice of their own"],
    ),
    (
        "too-many-devices",
        m.resource_slice(*[m.device(f"gpu-{i}") for i in range(129)]),
        ["spec.devices: must have at most 128 items, got 129"],
    ),
    (
        "too-many-tainted-devices",
        m.resource_slice(*[m.device(f"gpu-{i}", taints=[{"key": "k", "effect": "NoSchedule"}]) for i in range(65)]),
        [
            "spec.devices: must have at most 64 items when devices use taints, "
            "consumesCounters or list attributes, got 65"
        ],
    ),
    (
        "duplicate-device",
        m.resource_slice(m.device("gpu-0"), m.device("gpu-0")),
        ['spec.devices[1].name: duplicate device name "gpu-0"'],
    ),
    ("bad-device-name", m.resource_slice(m.device("GPU0")), [f'{DEV}.name: "GPU0" {DNS_LABEL}']),
    (
        "attribute-two-values",
        _attrs(a={"string": "x", "int": 1}),
        [f"{DEV}.attributes[a]: exactly one typed value is allowed, but int, string are set"],
    ),
    (
        "attribute-no-value",
        _attrs(a={}),
        [
            f"{DEV}.attributes[a]: exactly one typed value is required: {{string: ...}}, {{int: ...}}, {{bool: ...}} "
            "or {version: ...}"
        ],
    ),
    (
        "attribute-long-string",
        _attrs(a={"string": "x" * 65}),
        [f"{DEV}.attributes[a].string: must be at most 64 characters, got 65"],
    ),
    (
        "attribute-bad-version",
        _attrs(driverVersion={"version": "550.54"}),
        [
            f"{DEV}.attributes[driverVersion].version: '550.54' is not a semantic version (expected MAJOR.MINOR.PATCH "
            'such as "8.0.0")'
        ],
    ),
    (
        "attribute-int-as-string",
        _attrs(index={"int": "3"}),
        [f'{DEV}.attributes[index].int: must be an integer, got the string "3"'],
    ),
    ("attribute-int-too-big", _attrs(index={"int": 2**63}), [f"{DEV}.attributes[index].int: must fit in 64 bits"]),
    (
        "attribute-string-not-quoted",
        _attrs(a={"string": 12}),
        [f'{DEV}.attributes[a].string: must be a string, got a number: quote it, e.g. "12"'],
    ),
    ("attribute-empty-list", _attrs(a={"strings": []}), [f"{DEV}.attributes[a].strings: must not be empty"]),
    (
        "attribute-quantity-type",
        _attrs(memory={"quantity": "80Gi"}),
        [
            f"{DEV}.attributes[memory].quantity: attributes have no quantity type: put sizes in the device's capacity, "
            "e.g. memory: {value: 80Gi}"
        ],
    ),
    (
        "attribute-bad-domain",
        _attrs(**{"Nvidia_Com/x": {"int": 1}}),
        [
            f'{DEV}.attributes[Nvidia_Com/x]: "Nvidia_Com" is not a driver name: a DNS subdomain of at most 63 '
            'characters such as "gpu.nvidia.com"'
        ],
    ),
    (
        "attribute-two-slashes",
        _attrs(**{"a.b/c/d": {"int": 1}}),
        [f"{DEV}.attributes[a.b/c/d]: \"a.b/c/d\" must not contain more than one '/'"],
    ),
    (
        "too-many-attributes",
        _attrs(**{f"a{i}": {"int": i} for i in range(32)}),
        [f"{DEV}: must have at most 32 attributes and capacities together, got 33"],
    ),
    (
        "too-many-values",
        _attrs(a={"ints": list(range(49))}),
        [f"{DEV}: must have at most 48 attribute values in total, got 49"],
    ),
    ("capacity-no-value", _capacity(memory={}), [f"{DEV}.capacity[memory].value: required (a quantity such as 80Gi)"]),
    (
        "capacity-null-value",
        _capacity(memory={"value": None}),
        [f"{DEV}.capacity[memory].value: required (a quantity such as 80Gi)"],
    ),
    (
        "capacity-bool-after-one",
        m.resource_slice(m.device("a", capacity={"x": {"value": 1}}), m.device("b", capacity={"x": {"value": True}})),
        ['spec.devices[1].capacity[x].value: must be a quantity string such as "40Gi", got bool'],
    ),
    (
        "capacity-bad-quantity",
        _capacity(memory={"value": "80GB"}),
        [
            f"{DEV}.capacity[memory].value: '80GB' is not a quantity (expected a number with an optional suffix such "
            "as Ki, Mi, Gi, m, k, M, G)"
        ],
    ),
    (
        "policy-without-multiple",
        _capacity(False, memory={"value": "80Gi", "requestPolicy": {"default": "1Gi"}}),
        [f"{POLICY}: only allowed when the device sets allowMultipleAllocations: true"],
    ),
    (
        "policy-values-and-range",
        _policy(default="1Gi", validValues=["1Gi"], validRange={"min": "1Gi"}),
        [f"{POLICY}: at most one of validValues or validRange is allowed"],
    ),
    (
        "policy-values-no-default",
        _policy(validValues=["1Gi", "2Gi"]),
        [f"{POLICY}.default: required when validValues is set"],
    ),
    (
        "policy-values-unsorted",
        _policy(default="1Gi", validValues=["2Gi", "1Gi"]),
        [f"{POLICY}.validValues[1]: values must be unique and in ascending order"],
    ),
    (
        "policy-default-not-valid",
        _policy(default="3Gi", validValues=["1Gi", "2Gi"]),
        [f"{POLICY}.default: must be one of validValues"],
    ),
    (
        "policy-too-many-values",
        _policy(default="1Gi", validValues=[f"{i}Gi" for i in range(1, 12)]),
        [f"{POLICY}.validValues: must have at most 10 items, got 11"],
    ),
    (
        "policy-value-over-capacity",
        _policy(default="1Gi", validValues=["1Gi", "81Gi"]),
        [f"{POLICY}.validValues[1]: must not be larger than the capacity value 80Gi"],
    ),
    (
        "range-no-min",
        _policy(default="1Gi", validRange={"max": "2Gi"}),
        [f"{POLICY}.validRange.min: required when validRange is set"],
    ),
    ("range-no-default", _policy(validRange={"min": "1Gi"}), [f"{POLICY}.default: required when validRange is set"]),
    (
        "range-min-over-max",
        _policy(default="2Gi", validRange={"min": "4Gi", "max": "2Gi"}),
        [
            f"{POLICY}.validRange.min: must not be larger than default 2Gi",
            f"{POLICY}.validRange.max: must not be smaller than min 4Gi",
        ],
    ),
    (
        "range-step-misaligned",
        _policy(default="2Gi", validRange={"min": "1Gi", "step": "2Gi"}),
        [f"{POLICY}.validRange.step: default 2Gi is not min 1Gi plus a multiple of step 2Gi"],
    ),
    (
        "range-step-zero",
        _policy(default="1Gi", validRange={"min": "1Gi", "step": 0}),
        [f"{POLICY}.validRange.step: must be > 0"],
    ),
    (
        "counters-missing",
        m.resource_slice(m.device(consumesCounters=[{"counterSet": "gpu-0"}])),
        [f"{DEV}.consumesCounters[0].counters: required: write counters: {{<name>: {{value: <quantity>}}}}"],
    ),
    (
        "counters-plain-value",
        m.resource_slice(m.device(consumesCounters=[{"counterSet": "gpu-0", "counters": {"memory": "10Gi"}}])),
        [f"{DEV}.consumesCounters[0].counters[memory]: counters are objects: write memory: {{value: <quantity>}}"],
    ),
    (
        "too-many-consumed-sets",
        m.resource_slice(
            m.device(consumesCounters=[{"counterSet": f"s{i}", "counters": {"c": {"value": 1}}} for i in range(3)])
        ),
        [f"{DEV}.consumesCounters: must have at most 2 items, got 3"],
    ),
    (
        "duplicate-consumed-set",
        m.resource_slice(m.device(consumesCounters=[{"counterSet": "s", "counters": {"c": {"value": 1}}}] * 2)),
        [f'{DEV}.consumesCounters[1].counterSet: duplicate counter set "s"'],
    ),
    (
        "taint-no-effect",
        m.resource_slice(m.device(taints=[{"key": "k"}])),
        [f"{DEV}.taints[0].effect: required (NoSchedule, NoExecute or None)"],
    ),
    (
        "taint-bad-effect",
        m.resource_slice(m.device(taints=[{"key": "k", "effect": "PreferNoSchedule"}])),
        [f'{DEV}.taints[0].effect: must be NoSchedule, NoExecute or None, got "PreferNoSchedule"'],
    ),
    (
        "too-many-taints",
        m.resource_slice(m.device(taints=[{"key": f"k{i}", "effect": "None"} for i in range(17)])),
        [f"{DEV}.taints: must have at most 16 items, got 17"],
    ),
    (
        "device-node-without-per-device",
        m.resource_slice(m.device(nodeName="node-1")),
        [f"{DEV}: nodeName, nodeSelector and allNodes on a device need perDeviceNodeSelection: true in the slice spec"],
    ),
    (
        "per-device-without-node",
        _without("nodeName", perDeviceNodeSelection=True),
        [f"{DEV}: exactly one of nodeName, nodeSelector or allNodes is required, e.g. nodeName: <node>"],
    ),
    (
        "per-device-two-nodes",
        _without("nodeName", perDeviceNodeSelection=True, devices=[m.device(nodeName="node-1", allNodes=True)]),
        [f"{DEV}: exactly one of nodeName, nodeSelector or allNodes is allowed, but nodeName, allNodes are set"],
    ),
    (
        "binding-conditions-alone",
        m.resource_slice(m.device(bindingConditions=["ready"])),
        [f"{DEV}.bindingFailureConditions: required when bindingConditions are set"],
    ),
    (
        "binding-conditions-overlap",
        m.resource_slice(m.device(bindingConditions=["ready"], bindingFailureConditions=["ready"])),
        [f"{DEV}.bindingFailureConditions[0]: must not overlap with bindingConditions"],
    ),
    (
        "basic-in-v1",
        m.resource_slice({"name": "gpu-0", "basic": {"attributes": {"index": {"int": 0}}}}),
        [
            f"{DEV}.basic: the basic: wrapper is gone in resource.k8s.io/v1: "
            "move its attributes and capacity up into the device"
        ],
    ),
    (
        "counter-set-bad-name",
        {
            **_without("devices"),
            "spec": {
                **_without("devices")["spec"],
                "sharedCounters": [{"name": "GPU", "counters": {"m": {"value": 1}}}],
            },
        },
        [f'spec.sharedCounters[0].name: "GPU" {DNS_LABEL}'],
    ),
    (
        "too-many-counter-sets",
        {
            **_without("devices"),
            "spec": {
                **_without("devices")["spec"],
                "sharedCounters": [{"name": f"c{i}", "counters": {"m": {"value": 1}}} for i in range(9)],
            },
        },
        ["spec.sharedCounters: must have at most 8 items, got 9"],
    ),
]


@pytest.mark.parametrize(("resource_slice", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_slice_problems(
    problems: Callable[..., list[str]], resource_slice: dict[str, Any], expected: list[str]
) -> None:
    """Guards: each invalid slice gets exactly these messages, with file, object and full field path."""
    assert problems(resource_slice, file="slices.yaml") == [PREFIX + message for message in expected]


def test_policy_within_the_rules_is_accepted() -> None:
    """Guards: a consumable-capacity device with a valid range and step decodes with its policy."""
    policy = {"default": "2Gi", "validRange": {"min": "1Gi", "max": "9Gi", "step": "1Gi"}}
    objects = decode.load_documents([_policy(**policy)])
    capacity = objects.resource_slices[0].devices[0].capacity["memory"]
    assert capacity.request_policy is not None and capacity.request_policy.valid_range is not None
    assert str(capacity.request_policy.valid_range.step) == "1Gi"


def test_limits_are_inclusive() -> None:
    """Guards: 128 plain devices, 64 tainted devices and 32 attributes+capacities per device are accepted."""
    plain = m.resource_slice(*[m.device(f"gpu-{i}") for i in range(128)])
    tainted = m.resource_slice(
        *[m.device(f"gpu-{i}", taints=[{"key": "k", "effect": "NoSchedule"}]) for i in range(64)]
    )
    full = _attrs(**{f"a{i}": {"int": i} for i in range(31)})
    for index, given in enumerate((tainted, full)):
        given["metadata"] = {"name": f"node-1-gpu-{index}"}
    assert [len(s.devices) for s in decode.load_documents([plain, tainted, full]).resource_slices] == [128, 64, 1]
