"""Validation of DeviceClasses, Pods, Nodes and object metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dractl.model import decode


def _class(spec: dict[str, Any], name: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def _pod(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "infer", **meta}, "spec": spec}


CLASS = "m.yaml: DeviceClass gpu.nvidia.com: "
POD = "m.yaml: Pod default/infer: "
CLAIMS = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "class-empty-expression",
        _class({"selectors": [{"cel": {"expression": ""}}]}),
        [
            CLASS
            + 'spec.selectors[0].cel.expression: required (a CEL expression such as device.driver == "gpu.nvidia.com")'
        ],
    ),
    (
        "class-too-many-selectors",
        _class({"selectors": [{"cel": {"expression": "true"}}] * 33}),
        [CLASS + "spec.selectors: must have at most 32 items, got 33"],
    ),
    (
        "class-config-no-driver",
        _class({"config": [{"opaque": {"parameters": {"a": 1}}}]}),
        [CLASS + "spec.config[0].opaque.driver: required"],
    ),
    (
        "class-config-no-parameters",
        _class({"config": [{"opaque": {"driver": "gpu.nvidia.com"}}]}),
        [CLASS + "spec.config[0].opaque.parameters: required (a JSON object for the driver)"],
    ),
    (
        "class-too-many-configs",
        _class({"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}] * 33}),
        [CLASS + "spec.config: must have at most 32 items, got 33"],
    ),
    (
        "class-extended-resource",
        _class({"extendedResourceName": "kubernetes.io/gpu"}),
        [
            CLASS + 'spec.extendedResourceName: "kubernetes.io/gpu" is not an extended resource name: a domain outside '
            "kubernetes.io, '/', and a name, e.g. \"example.com/gpu\""
        ],
    ),
    (
        "class-driver-name-in-spec",
        _class({"driverName": "gpu.nvidia.com"}),
        [
            CLASS + "spec.driverName: DeviceClass has no driverName: select the driver with spec.selectors: [{cel: "
            "{expression: 'device.driver == \"gpu.nvidia.com\"'}}]"
        ],
    ),
    (
        "class-bad-name",
        _class({}, name="GPU"),
        [
            'm.yaml: DeviceClass GPU: metadata.name: "GPU" is not a DNS subdomain: at most 253 lowercase letters, '
            "digits, '-' and '.', starting and ending with a letter or digit"
        ],
    ),
    ("class-no-name", {**_class({}), "metadata": {}}, ["m.yaml: DeviceClass (document 1): metadata.name: required"]),
    (
        "class-unknown-top-field",
        {**_class({}), "status": {}},
        [CLASS + "status: unknown field (fields here: apiVersion, kind, metadata, spec)"],
    ),
    (
        "class-metadata-typo",
        {**_class({}), "metadata": {"name": "gpu.nvidia.com", "label": {}}},
        [CLASS + "metadata.label: unknown field; did you mean labels?"],
    ),
    (
        "pod-both-claim-sources",
        _pod({"resourceClaims": [{"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}]}),
        [
            POD + "spec.resourceClaims[0]: "
            "exactly one of resourceClaimName or resourceClaimTemplateName is allowed, but both are set"
        ],
    ),
    (
        "pod-no-claim-source",
        _pod({"resourceClaims": [{"name": "gpu"}]}),
        [POD + "spec.resourceClaims[0]: exactly one of resourceClaimName or resourceClaimTemplateName is required"],
    ),
    (
        "pod-duplicate-claim",
        _pod({"resourceClaims": CLAIMS * 2}),
        [POD + 'spec.resourceClaims[1].name: duplicate claim name "gpu"'],
    ),
    (
        "pod-container-unknown-claim",
        _pod({"resourceClaims": CLAIMS, "containers": [{"name": "app", "resources": {"claims": [{"name": "gpus"}]}}]}),
        [
            POD + 'spec.containers[0].resources.claims[0].name: "gpus" is not in spec.resourceClaims: add {name: gpus, '
            "resourceClaimTemplateName: <template>} "
            "(or resourceClaimName) there"
        ],
    ),
    (
        "pod-container-claim-typo",
        _pod(
            {
                "resourceClaims": CLAIMS,
                "containers": [{"name": "app", "resources": {"claims": [{"name": "gpu", "requests": "a"}]}}],
            }
        ),
        [POD + "spec.containers[0].resources.claims[0].requests: unknown field; did you mean request?"],
    ),
    ("pod-container-no-name", _pod({"containers": [{"image": "x"}]}), [POD + "spec.containers[0].name: required"]),
    (
        "pod-no-name",
        {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "a"}]}},
        ["m.yaml: Pod default/(document 1): metadata.name: required"],
    ),
    (
        "pod-node-selector-not-string",
        _pod({"nodeSelector": {"gpu": True}}),
        [POD + 'spec.nodeSelector[gpu]: must be a string, got a boolean: quote it, e.g. gpu: "true"'],
    ),
    (
        "pod-label-key-not-string",
        _pod({}, labels={1: "a"}),
        [POD + 'metadata.labels[1]: keys must be strings: quote it, e.g. "1"'],
    ),
    (
        "pod-bad-namespace",
        _pod({}, namespace="ML"),
        [
            'm.yaml: Pod ML/infer: metadata.namespace: "ML" is not a DNS label: at most 63 lowercase letters, digits '
            "and '-', starting and ending with a letter or digit"
        ],
    ),
    (
        "node-bad-name",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "Node_1"}},
        [
            'm.yaml: Node Node_1: metadata.name: "Node_1" is not a DNS subdomain: at most 253 lowercase letters, '
            "digits, '-' and '.', starting and ending with a letter or digit"
        ],
    ),
]


@pytest.mark.parametrize(("manifest", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_class_pod_node_problems(
    problems: Callable[..., list[str]], manifest: dict[str, Any], expected: list[str]
) -> None:
    """Guards: each invalid class, pod or node gets exactly these messages, with file, object and full field path."""
    assert problems(manifest) == expected


def test_cel_is_not_compiled_here() -> None:
    """Guards: CEL that Kubernetes would reject is kept as text for dractl.cel to judge,
    with class config and extended name."""
    spec = {
        "selectors": [{"cel": {"expression": 'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")'}}],
        "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "MPS"}}}}],
        "extendedResourceName": "example.com/gpu",
    }
    device_class = decode.load_documents([_class(spec)]).device_classes[0]
    assert device_class.selectors == ('device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")',)
    assert device_class.config[0].parameters == {"sharing": {"strategy": "MPS"}}
    assert device_class.extended_resource_name == "example.com/gpu"


def test_pod_spec_fields_outside_dra_are_not_checked() -> None:
    """Guards: the many Pod fields allocation does not use (image, env, volumes, ...) pass through untouched."""
    pod = _pod(
        {
            "restartPolicy": "Never",
            "volumes": [{"name": "v"}],
            "containers": [{"name": "a", "image": "x", "env": [{"name": "A"}]}],
        }
    )
    assert decode.load_documents([pod]).pods[0].meta.name == "infer"
