"""Defaults the API server applies, and conversion of the older served versions (v1beta1, v1beta2)."""

from __future__ import annotations

import yaml
from support import model_manifests as m

from dractl import model
from dractl.model import decode


def _claim(text: str) -> model.ResourceClaim:
    return decode.load_text(text).resource_claims[0]


def test_request_defaults() -> None:
    """Guards: allocationMode ExactCount, count 1, no admin access, namespace "default" when unset."""
    claim = decode.load_documents([m.claim()]).resource_claims[0]
    exactly = claim.spec.requests[0].exactly
    assert claim.meta.namespace == "default"
    assert exactly == model.ExactDeviceRequest(device_class_name="gpu.nvidia.com")
    assert (
        exactly.allocation_mode is model.AllocationMode.EXACT_COUNT
        and exactly.count == 1
        and exactly.admin_access is None
    )


def test_explicit_count_zero_means_one() -> None:
    """Guards: like the API server's defaulting, `count: 0` in ExactCount mode becomes 1 (not an error)."""
    claim = m.claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}])
    exactly = decode.load_documents([claim]).resource_claims[0].spec.requests[0].exactly
    assert exactly is not None and exactly.count == 1


def test_all_mode_has_count_zero() -> None:
    """Guards: allocationMode All leaves count at 0, for requests and subrequests."""
    claim = m.claim(
        requests=[
            {"name": "every", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
            {
                "name": "alt",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
                    {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 2},
                ],
            },
        ]
    )
    requests = decode.load_documents([claim]).resource_claims[0].spec.requests
    assert requests[0].exactly is not None
    assert (requests[0].exactly.allocation_mode, requests[0].exactly.count) == (model.AllocationMode.ALL, 0)
    assert [(s.name, s.allocation_mode, s.count) for s in requests[1].first_available] == [
        ("big", model.AllocationMode.ALL, 0),
        ("small", model.AllocationMode.EXACT_COUNT, 2),
    ]


def test_toleration_operator_defaults_to_equal() -> None:
    """Guards: a toleration without operator means Equal; empty effect matches every effect."""
    tolerations = [
        {"key": "example.com/unhealthy", "value": "yes"},
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ]
    claim = m.claim(
        requests=[{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "tolerations": tolerations}}]
    )
    exactly = decode.load_documents([claim]).resource_claims[0].spec.requests[0].exactly
    assert exactly is not None
    assert exactly.tolerations == (
        model.DeviceToleration(key="example.com/unhealthy", operator="Equal", value="yes"),
        model.DeviceToleration(operator="Exists", effect="NoExecute", toleration_seconds=30),
    )


def test_slice_defaults_and_typed_values() -> None:
    """Guards: pool generation 0 when unset; attributes keep their types, versions parse,
    capacity keeps its spelling."""
    text = yaml.safe_dump(m.resource_slice(pool={"name": "node-1", "resourceSliceCount": 1}))
    objects = decode.load_text(text)
    pool_slice = objects.resource_slices[0]
    assert pool_slice.pool == model.ResourcePool(name="node-1", generation=0, resource_slice_count=1)
    assert pool_slice.node_name == "node-1" and not pool_slice.all_nodes and pool_slice.node_selector is None
    device = pool_slice.devices[0]
    assert device.attributes["type"] == model.DeviceAttribute(model.AttributeKind.STRING, ("gpu",))
    assert device.attributes["index"] == model.DeviceAttribute(model.AttributeKind.INT, (0,))
    version = device.attributes["cudaComputeCapability"]
    assert (
        version.kind is model.AttributeKind.VERSION
        and version.scalar == model.semver.parse("8.0.0")
        and version.texts == ("8.0.0",)
    )
    assert (
        device.capacity["memory"].value == model.quantity.parse("80Gi")
        and str(device.capacity["memory"].value) == "80Gi"
    )


def test_list_attributes_counters_taints_and_per_device_nodes() -> None:
    """Guards: list attributes, shared counters, consumed counters, taints and per-device node selection decode."""
    counters = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "counters"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-1", "resourceSliceCount": 2},
            "nodeName": "node-1",
            "sharedCounters": [
                {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": 98}}}
            ],
        },
    }
    mig = m.device(
        "gpu-0-mig-1g10gb-0",
        attributes={"profile": {"string": "1g.10gb"}, "links": {"strings": ["nvlink-0", "nvlink-1"]}},
        consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}],
        taints=[{"key": "example.com/degraded", "effect": "NoSchedule"}],
        nodeName="node-1",
    )
    devices = m.resource_slice(mig, perDeviceNodeSelection=True, pool={"name": "node-1", "resourceSliceCount": 2})
    del devices["spec"]["nodeName"]
    objects = decode.load_documents([counters, devices])
    shared = objects.resource_slices[0].shared_counters[0]
    assert shared.name == "gpu-0-counters" and shared.counters["multiprocessors"] == model.quantity.from_int(98)
    device = objects.resource_slices[1].devices[0]
    assert objects.resource_slices[1].per_device_node_selection and device.node_name == "node-1"
    assert device.attributes["links"] == model.DeviceAttribute(
        model.AttributeKind.STRING, ("nvlink-0", "nvlink-1"), is_list=True
    )
    assert device.consumes_counters[0].counters["memory"] == model.quantity.parse("10Gi")
    assert device.taints == (model.DeviceTaint(key="example.com/degraded", effect="NoSchedule"),)


def test_v1beta1_requests_and_devices_are_converted() -> None:
    """Guards: v1beta1 request fields inline and devices under `basic` become the v1 shape."""
    text = """\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: old}
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: gpu.nvidia.com
      count: 2
      adminAccess: true
      selectors: [{cel: {expression: "true"}}]
    - name: alt
      firstAvailable: [{name: one, deviceClassName: gpu.nvidia.com}]
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceSlice
metadata: {name: old-slice}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-1, resourceSliceCount: 1}
  nodeName: node-1
  devices:
  - name: gpu-0
    basic:
      attributes: {productName: {string: T4}}
      capacity: {memory: {value: 16Gi}}
"""
    objects = decode.load_text(text)
    requests = objects.resource_claims[0].spec.requests
    assert requests[0].exactly == model.ExactDeviceRequest(
        device_class_name="gpu.nvidia.com", count=2, admin_access=True, selectors=("true",)
    )
    assert requests[1].first_available[0].name == "one"
    device = objects.resource_slices[0].devices[0]
    assert device.name == "gpu-0" and device.attributes["productName"].scalar == "T4"
    assert device.capacity["memory"].value == model.quantity.parse("16Gi")


def test_v1beta2_is_read_as_v1() -> None:
    """Guards: v1beta2 has the v1 shape and decodes to the same values."""
    v1 = m.claim()
    beta2 = {**v1, "apiVersion": "resource.k8s.io/v1beta2"}
    assert decode.load_documents([beta2]).resource_claims[0].spec == decode.load_documents([v1]).resource_claims[0].spec


def test_status_allocation_is_decoded() -> None:
    """Guards: claims already allocated in the input keep results, config, node selector and reservedFor."""
    text = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: held, namespace: ml, uid: 1f4c}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
status:
  allocation:
    devices:
      results:
      - {request: gpu, driver: gpu.nvidia.com, pool: node-1, device: gpu-0}
      config:
      - source: FromClass
        requests: [gpu]
        opaque: {driver: gpu.nvidia.com, parameters: {sharing: {strategy: TimeSlicing}}}
    nodeSelector:
      nodeSelectorTerms:
      - matchFields: [{key: metadata.name, operator: In, values: [node-1]}]
  reservedFor:
  - {resource: pods, name: infer, uid: 7d2e}
"""
    claim = _claim(text)
    assert claim.allocation is not None
    assert claim.allocation.results == (
        model.DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="node-1", device="gpu-0"),
    )
    assert claim.allocation.config[0].opaque.parameters == {"sharing": {"strategy": "TimeSlicing"}}
    assert claim.allocation.node_selector == model.NodeSelector(
        (model.NodeSelectorTerm(match_fields=(model.NodeSelectorRequirement("metadata.name", "In", ("node-1",)),)),)
    )
    assert claim.reserved_for == (model.ResourceClaimConsumerReference(resource="pods", name="infer", uid="7d2e"),)


def test_template_keeps_claim_metadata() -> None:
    """Guards: a template's spec.metadata labels and annotations are kept for the claims made from it."""
    text = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: ml}
spec:
  metadata: {labels: {team: ml}, annotations: {note: x}}
  spec:
    devices:
      requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]
"""
    template = decode.load_text(text).resource_claim_templates[0]
    assert dict(template.claim_labels) == {"team": "ml"} and dict(template.claim_annotations) == {"note": "x"}
    assert template.spec.requests[0].name == "gpu"


def test_unquoted_timestamps_stay_api_strings() -> None:
    """Guards: unquoted timestamps stay the strings they are written as, as kubectl (goyaml.v2) reads them."""
    text = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: held, deletionTimestamp: 2026-11-21T13:00:00Z}
spec:
  devices:
    requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]
status:
  allocation:
    allocationTimestamp: 2026-11-21T12:59:30+01:00
    devices:
      results: [{request: gpu, driver: gpu.nvidia.com, pool: node-1, device: gpu-0}]
"""
    claim = _claim(text)
    assert claim.meta.deletion_timestamp == "2026-11-21T13:00:00Z"
    assert claim.allocation is not None and claim.allocation.allocation_timestamp == "2026-11-21T12:59:30+01:00"
