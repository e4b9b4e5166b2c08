"""`encode.resource_slice`: the API's JSON shape, and decode(encode(x)) == x for slices."""

from __future__ import annotations

import dataclasses

import pytest

from dractl.model import decode, encode, types
from dractl.node import discover

FULL = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: every-field
  ownerReferences: [{apiVersion: v1, kind: Node, name: n1, uid: u-1, controller: true}]
spec:
  driver: gpu.example.com
  pool: {name: pool/a, generation: 3, resourceSliceCount: 2}
  perDeviceNodeSelection: true
  devices:
  - name: d0
    nodeName: n1
    attributes:
      s: {string: x}
      i: {int: -4}
      b: {bool: false}
      v: {version: 1.2.3-rc.1+build}
      example.com/list: {strings: [a, b]}
      vs: {versions: [1.0.0, 2.0.0]}
    capacity:
      memory: {value: 80Gi, requestPolicy: {default: 1Gi, validRange: {min: 1Gi, max: 80Gi, step: 1Gi}}}
      shares: {value: '4', requestPolicy: {default: '1', validValues: ['1', '2', '4']}}
    allowMultipleAllocations: true
    taints:
    - {key: example.com/broken, value: 'yes', effect: NoExecute, timeAdded: '2026-01-01T00:00:00Z'}
    - {key: k, effect: None}
    consumesCounters: [{counterSet: set-a, counters: {mem: {value: 1Gi}}}]
    bindsToNode: true
    bindingConditions: [ready]
    bindingFailureConditions: [failed]
  - name: d1
    allNodes: true
  - name: d2
    nodeSelector: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a, b]}]}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: counters-only}
spec:
  driver: gpu.example.com
  pool: {name: pool/a, generation: 0, resourceSliceCount: 2}
  allNodes: true
  sharedCounters: [{name: set-a, counters: {mem: {value: 8Gi}}}]
"""


def _roundtrip(s: types.ResourceSlice) -> types.ResourceSlice:
    back = decode.load_documents([encode.resource_slice(s)], file=s.source.file).resource_slices[0]
    return dataclasses.replace(back, source=s.source)


def test_every_field_round_trips() -> None:
    """Guards decode(encode(x)) == x for a slice using every field the API has."""
    objects = decode.load_text(FULL, file="full.yaml")
    assert len(objects.resource_slices) == 2
    for s in objects.resource_slices:
        assert _roundtrip(s) == s


@pytest.mark.parametrize("example", discover.EXAMPLES, ids=lambda e: e.file)
def test_example_slices_round_trip(example: discover.Example) -> None:
    """Guards the round trip on the shipped example node files."""
    for s in decode.load_paths([discover.EXAMPLES_DIR / example.file]).resource_slices:
        assert _roundtrip(s) == s


def test_shape_omits_unset_fields_and_keeps_pool_numbers() -> None:
    """Guards the API's JSON shape: omitempty fields left out, generation and resourceSliceCount always written."""
    s = types.ResourceSlice(
        meta=types.ObjectMeta(name="s"),
        driver="gpu.nvidia.com",
        pool=types.ResourcePool(name="n", generation=0, resource_slice_count=1),
        node_name="n",
        devices=(types.Device(name="gpu-0"),),
    )
    assert encode.resource_slice(s) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "n",
            "devices": [{"name": "gpu-0"}],
        },
    }


def test_versions_keep_their_spelling() -> None:
    """Guards that a version attribute is written as published, not re-rendered from the parsed value."""
    attribute = decode.load_text(FULL, file="full.yaml").resource_slices[0].devices[0].attributes["v"]
    assert encode.device_attribute(attribute) == {"version": "1.2.3-rc.1+build"}
