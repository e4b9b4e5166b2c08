"""Validation of ResourceClaims and ResourceClaimTemplates: every rule and limit, with the full field path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import model_manifests as m

PREFIX = "claims.yaml: ResourceClaim default/train: "
DEVICES = "spec.devices"


def _request(**exactly: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}


def _exact(**fields: Any) -> dict[str, Any]:
    return m.claim(requests=[_request(**fields)])


def _requests(n: int) -> list[dict[str, Any]]:
    return [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com"}} for i in range(n)]


def _selectors(n: int) -> list[dict[str, Any]]:
    return [{"cel": {"expression": "true"}}] * n


REQ = f"{DEVICES}.requests[0]"
EXACT = f"{REQ}.exactly"

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("count-negative", _exact(count=-2), [f"{EXACT}.count: must be >= 1"]),
    ("count-not-int", _exact(count="2"), [f'{EXACT}.count: must be an integer, got the string "2"']),
    (
        "all-with-count",
        _exact(allocationMode="All", count=2),
        [f"{EXACT}.count: must be 0 or unset when allocationMode is All"],
    ),
    ("unknown-mode", _exact(allocationMode="Some"), [f'{EXACT}.allocationMode: must be ExactCount or All, got "Some"']),
    (
        "no-class",
        m.claim(requests=[{"name": "gpu", "exactly": {}}]),
        [f"{EXACT}.deviceClassName: required (the name of a DeviceClass, e.g. gpu.nvidia.com)"],
    ),
    (
        "bad-class-name",
        _exact(deviceClassName="GPU_class"),
        [
            f'{EXACT}.deviceClassName: "GPU_class" is not a DNS subdomain: at most 253 lowercase letters, digits, '
            "'-' and '.', starting and ending with a letter or digit"
        ],
    ),
    (
        "no-name",
        m.claim(requests=[{"exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
        [f'{REQ}.name: required (a DNS label such as "gpu")'],
    ),
    (
        "bad-request-name",
        m.claim(requests=[{"name": "GPU.0", "exactly": {"deviceClassName": "c"}}]),
        [
            f"{REQ}.name: \"GPU.0\" is not a DNS label: at most 63 lowercase letters, digits and '-', starting and "
            "ending with a letter or digit"
        ],
    ),
    (
        "duplicate-request",
        m.claim(requests=[_request(), _request()]),
        [f'{DEVICES}.requests[1].name: duplicate request name "gpu"'],
    ),
    (
        "neither-exactly-nor-first",
        m.claim(requests=[{"name": "gpu"}]),
        [
            f"{REQ}: exactly one of `exactly` or `firstAvailable` is required: write exactly: "
            "{deviceClassName: <class>}"
        ],
    ),
    (
        "both-exactly-and-first",
        m.claim(requests=[{**_request(), "firstAvailable": [{"name": "a", "deviceClassName": "c"}]}]),
        [f"{REQ}: exactly one of `exactly` or `firstAvailable` is allowed, but both are set"],
    ),
    ("too-many-requests", m.claim(requests=_requests(33)), [f"{DEVICES}.requests: must have at most 32 items, got 33"]),
    (
        "too-many-selectors",
        _exact(selectors=_selectors(33)),
        [f"{EXACT}.selectors: must have at most 32 items, got 33"],
    ),
    (
        "empty-expression",
        _exact(selectors=[{"cel": {"expression": "  "}}]),
        [f'{EXACT}.selectors[0].cel.expression: required (a CEL expression such as device.driver == "gpu.nvidia.com")'],
    ),
    (
        "long-expression",
        _exact(selectors=[{"cel": {"expression": "true || " * 1280 + "true"}}]),
        [f"{EXACT}.selectors[0].cel.expression: must be at most 10240 bytes, got 10244"],
    ),
    (
        "selector-cel-null",
        _exact(selectors=[{"cel": None}]),
        [f"{EXACT}.selectors[0].cel: required: write - cel: {{expression: ...}}"],
    ),
    (
        "selector-without-cel",
        _exact(selectors=[{"expression": "true"}]),
        [
            f"{EXACT}.selectors[0].expression: the expression goes under cel: write - cel: {{expression: ...}}",
            f"{EXACT}.selectors[0].cel: required: write - cel: {{expression: ...}}",
        ],
    ),
    (
        "too-many-subrequests",
        m.claim(
            requests=[{"name": "gpu", "firstAvailable": [{"name": f"s{i}", "deviceClassName": "c"} for i in range(9)]}]
        ),
        [f"{REQ}.firstAvailable: must have at most 8 items, got 9"],
    ),
    (
        "empty-first-available",
        m.claim(requests=[{"name": "gpu", "firstAvailable": []}]),
        [f"{REQ}.firstAvailable: must not be empty: list the alternatives in order of preference"],
    ),
    (
        "duplicate-subrequest",
        m.claim(requests=[{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "c"}] * 2}]),
        [f'{REQ}.firstAvailable[1].name: duplicate subrequest name "a"'],
    ),
    (
        "subrequest-admin-access",
        m.claim(
            requests=[{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "c", "adminAccess": True}]}]
        ),
        [
            f"{REQ}.firstAvailable[0].adminAccess: not allowed in firstAvailable subrequests: use exactly: "
            "{adminAccess: true} on a request"
        ],
    ),
    (
        "subrequest-count",
        m.claim(requests=[{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "c", "count": -1}]}]),
        [f"{REQ}.firstAvailable[0].count: must be >= 1"],
    ),
    (
        "too-many-tolerations",
        _exact(tolerations=[{"operator": "Exists"}] * 17),
        [f"{EXACT}.tolerations: must have at most 16 items, got 17"],
    ),
    (
        "toleration-exists-with-value",
        _exact(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
        [f"{EXACT}.tolerations[0].value: must be empty when operator is Exists"],
    ),
    (
        "toleration-equal-without-key",
        _exact(tolerations=[{"value": "v"}]),
        [
            f"{EXACT}.tolerations[0].key: required unless operator is Exists "
            "(an empty key with Exists tolerates every taint)"
        ],
    ),
    (
        "toleration-bad-operator",
        _exact(tolerations=[{"key": "k", "operator": "In"}]),
        [f'{EXACT}.tolerations[0].operator: must be Equal or Exists, got "In"'],
    ),
    (
        "toleration-bad-effect",
        _exact(tolerations=[{"key": "k", "effect": "PreferNoSchedule"}]),
        [f'{EXACT}.tolerations[0].effect: must be empty, NoSchedule, NoExecute or None, got "PreferNoSchedule"'],
    ),
    (
        "toleration-bad-value",
        _exact(tolerations=[{"key": "k", "value": "a b"}]),
        [
            f"{EXACT}.tolerations[0].value: \"a b\" is not a label value: at most 63 letters, digits, '-', '_' and "
            "'.', starting and ending with a letter or digit"
        ],
    ),
    (
        "capacity-bad-quantity",
        _exact(capacity={"requests": {"memory": "10GB"}}),
        [
            f"{EXACT}.capacity.requests[memory]: '10GB' is not a quantity (expected a number with an optional suffix "
            "such as Ki, Mi, Gi, m, k, M, G)"
        ],
    ),
    (
        "capacity-bad-name",
        _exact(capacity={"requests": {"gpu-memory": "10Gi"}}),
        [
            f'{EXACT}.capacity.requests[gpu-memory]: "gpu-memory" is not a C identifier: at most 32 letters, digits '
            "and '_', not starting with a digit (e.g. gpuMemory)"
        ],
    ),
    (
        "constraint-unknown-request",
        m.claim(constraints=[{"requests": ["gpu", "nic"], "matchAttribute": "gpu.nvidia.com/uuid"}]),
        [
            f'{DEVICES}.constraints[0].requests[1]: "nic" is not a request of this claim (requests: gpu; a subrequest '
            "is written request/subrequest)"
        ],
    ),
    (
        "constraint-subrequest-of-exactly",
        m.claim(constraints=[{"requests": ["gpu/a"], "matchAttribute": "gpu.nvidia.com/uuid"}]),
        [
            f'{DEVICES}.constraints[0].requests[0]: "gpu/a" is not a request of this claim (requests: gpu; a '
            "subrequest is written request/subrequest)"
        ],
    ),
    (
        "constraint-duplicate-request",
        m.claim(constraints=[{"requests": ["gpu", "gpu"], "matchAttribute": "gpu.nvidia.com/uuid"}]),
        [f'{DEVICES}.constraints[0].requests[1]: duplicate request "gpu"'],
    ),
    (
        "constraint-not-qualified",
        m.claim(constraints=[{"matchAttribute": "parentUUID"}]),
        [
            f'{DEVICES}.constraints[0].matchAttribute: "parentUUID" must be fully qualified, a domain and a name '
            "separated by '/', e.g. \"gpu.nvidia.com/parentUUID\""
        ],
    ),
    (
        "constraint-both",
        m.claim(constraints=[{"matchAttribute": "a.b/c", "distinctAttribute": "a.b/c"}]),
        [f"{DEVICES}.constraints[0]: exactly one of matchAttribute or distinctAttribute is allowed, but both are set"],
    ),
    (
        "constraint-neither",
        m.claim(constraints=[{"requests": ["gpu"]}]),
        [
            f"{DEVICES}.constraints[0]: exactly one of matchAttribute or distinctAttribute is required, e.g. "
            "matchAttribute: gpu.nvidia.com/parentUUID"
        ],
    ),
    (
        "too-many-constraints",
        m.claim(constraints=[{"matchAttribute": "a.b/c"}] * 33),
        [f"{DEVICES}.constraints: must have at most 32 items, got 33"],
    ),
    (
        "config-unknown-request",
        m.claim(config=[{"requests": ["nic"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]),
        [
            f'{DEVICES}.config[0].requests[0]: "nic" is not a request of this claim (requests: gpu; a subrequest is '
            "written request/subrequest)"
        ],
    ),
    (
        "config-no-opaque",
        m.claim(config=[{"requests": ["gpu"]}]),
        [f"{DEVICES}.config[0].opaque: required: write opaque: {{driver: gpu.nvidia.com, parameters: {{...}}}}"],
    ),
    (
        "config-parameters-not-object",
        m.claim(config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": [1]}}]),
        [f"{DEVICES}.config[0].opaque.parameters: must be a JSON object, got a list"],
    ),
    (
        "config-parameters-too-big",
        m.claim(config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"blob": "x" * 10240}}}]),
        [f"{DEVICES}.config[0].opaque.parameters: must be at most 10240 bytes of JSON, got 10251"],
    ),
    (
        "config-bad-driver",
        m.claim(config=[{"opaque": {"driver": "gpu_nvidia", "parameters": {}}}]),
        [
            f'{DEVICES}.config[0].opaque.driver: "gpu_nvidia" is not a driver name: a DNS subdomain of at most 63 '
            'characters such as "gpu.nvidia.com"'
        ],
    ),
    ("unknown-field-suggestion", _exact(selector=[]), [f"{EXACT}.selector: unknown field; did you mean selectors?"]),
    (
        "requests-outside-devices",
        {**m.claim(), "spec": {"requests": []}},
        ["spec.requests: requests go under devices: write devices: {requests: [...]}"],
    ),
    (
        "reserved-without-allocation",
        {**m.claim(), "status": {"reservedFor": [{"resource": "pods", "name": "a", "uid": "1"}]}},
        ["status.reservedFor: must be empty while status.allocation is not set"],
    ),
    (
        "result-unknown-request",
        {
            **m.claim(),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "nic", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}]
                    }
                }
            },
        },
        ['status.allocation.devices.results[0].request: "nic" is not a request of this claim (requests: gpu)'],
    ),
    (
        "result-bad-share-id",
        {
            **m.claim(),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": "gpu.nvidia.com",
                                "pool": "node-1",
                                "device": "gpu-0",
                                "shareID": "ABC",
                            }
                        ]
                    }
                }
            },
        },
        ['status.allocation.devices.results[0].shareID: "ABC" must be a lowercase RFC 4122 UUID'],
    ),
    (
        "label-key-invalid",
        {**m.claim(), "metadata": {"name": "train", "labels": {"-team": "ml"}}},
        [
            "metadata.labels[-team]: \"-team\" is not a label key: an optional DNS subdomain prefix and '/', then at "
            "most 63 letters, "
            "digits, '-', '_' and '.', starting and ending with a letter or digit"
        ],
    ),
    (
        "label-value-not-string",
        {**m.claim(), "metadata": {"name": "train", "labels": {"gpu": True}}},
        ['metadata.labels[gpu]: must be a string, got a boolean: quote it, e.g. gpu: "true"'],
    ),
]


@pytest.mark.parametrize(("claim", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_claim_problems(problems: Callable[..., list[str]], claim: dict[str, Any], expected: list[str]) -> None:
    """Guards: each invalid claim gets exactly these messages, with file, object and full field path."""
    assert problems(claim, file="claims.yaml") == [PREFIX + message for message in expected]


def test_exactly_thirty_two_requests_are_fine() -> None:
    """Guards: the limits are inclusive (32 requests with 32 selectors each decode)."""
    from dractl.model import decode

    requests = _requests(32)
    for request in requests:
        request["exactly"]["selectors"] = _selectors(32)
    assert len(decode.load_documents([m.claim(requests=requests)]).resource_claims[0].spec.requests) == 32


def test_subrequest_references_are_valid() -> None:
    """Guards: constraints and configs may name a request with firstAvailable or one of its subrequests."""
    from dractl.model import decode

    claim = m.claim(
        requests=[
            {
                "name": "gpu",
                "firstAvailable": [{"name": "big", "deviceClassName": "c"}, {"name": "small", "deviceClassName": "c"}],
            }
        ],
        constraints=[{"requests": ["gpu/big"], "distinctAttribute": "gpu.nvidia.com/uuid"}],
        config=[{"requests": ["gpu", "gpu/small"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}],
    )
    spec = decode.load_documents([claim]).resource_claims[0].spec
    assert spec.constraints[0].requests == ("gpu/big",) and spec.config[0].requests == ("gpu", "gpu/small")


def test_template_problems_use_the_template_path(problems: Callable[..., list[str]]) -> None:
    """Guards: a template's claim spec is validated like a claim, under spec.spec,
    and a missing inner spec is explained."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [_request(count=-3)]}}},
    }
    flat = {
        **template,
        "metadata": {"name": "flat", "namespace": "ml"},
        "spec": {"devices": {"requests": [_request()]}},
    }
    assert problems([template, flat]) == [
        "m.yaml: ResourceClaimTemplate ml/one: spec.spec.devices.requests[0].exactly.count: must be >= 1",
        "m.yaml: ResourceClaimTemplate ml/flat: spec.devices: the claim spec of a template goes under spec.spec: write "
        "spec: {spec: {devices: ...}}",
    ]


def test_all_problems_of_one_claim_are_reported(problems: Callable[..., list[str]]) -> None:
    """Guards: validation goes on after the first problem and reports every one in document order."""
    claim = m.claim(
        requests=[_request(count=-1), {"name": "Bad", "exactly": {"deviceClassName": "c", "allocationMode": "x"}}]
    )
    assert problems(claim) == [
        "m.yaml: ResourceClaim default/train: spec.devices.requests[0].exactly.count: must be >= 1",
        'm.yaml: ResourceClaim default/train: spec.devices.requests[1].name: "Bad" is not a DNS label: at most 63 '
        "lowercase letters, digits and '-', starting and ending with a letter or digit",
        "m.yaml: ResourceClaim default/train: spec.devices.requests[1].exactly.allocationMode: must be ExactCount or "
        'All, got "x"',
    ]
