"""Encoding claims and allocation results into the API's JSON shape, and the round trip through the decoder."""

from __future__ import annotations

import json

import yaml

from dractl import model
from dractl.model import decode, encode

ALLOCATED = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: train
  namespace: ml
  uid: 0b5c7d1e-2f3a-4b5c-8d9e-0f1a2b3c4d5e
  labels: {team: ml}
  finalizers: [resource.kubernetes.io/delete-protection]
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.nvidia.com
        count: 2
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'}
        tolerations: [{key: example.com/maintenance, operator: Exists}]
    - name: mig
      firstAvailable:
      - {name: big, deviceClassName: mig.nvidia.com, allocationMode: All}
      - {name: small, deviceClassName: mig.nvidia.com, capacity: {requests: {memory: 10Gi}}}
    constraints:
    - {requests: [gpus], matchAttribute: gpu.nvidia.com/nvlinkDomain}
    config:
    - {requests: [gpus], opaque: {driver: gpu.nvidia.com, parameters: {sharing: {strategy: MPS}}}}
status:
  allocation:
    devices:
      results:
      - request: gpus
        driver: gpu.nvidia.com
        pool: node-1
        device: gpu-0
        tolerations: [{key: example.com/maintenance, operator: Exists}]
      - request: gpus
        driver: gpu.nvidia.com
        pool: node-1
        device: gpu-1
        tolerations: [{key: example.com/maintenance, operator: Exists}]
      - request: mig/small
        driver: gpu.nvidia.com
        pool: node-1
        device: gpu-2
        shareID: 6f1c1b52-6a39-4c55-9d0f-5b8d3c2b9e11
        consumedCapacity: {memory: 10Gi}
      config:
      - {source: FromClaim, requests: [gpus], opaque: {driver: gpu.nvidia.com, parameters: {sharing: {strategy: MPS}}}}
    nodeSelector:
      nodeSelectorTerms:
      - matchFields: [{key: metadata.name, operator: In, values: [node-1]}]
  reservedFor:
  - {resource: pods, name: train-0, uid: 4a4f3c2e-1b0d-4e6f-9a8b-7c6d5e4f3a2b}
"""


def test_claim_has_the_api_shape() -> None:
    """Guards: the encoded claim has exactly the API's fields, defaults spelled out, and empty fields omitted."""
    claim = decode.load_text(ALLOCATED).resource_claims[0]
    encoded = encode.resource_claim(claim)
    assert encoded == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "0b5c7d1e-2f3a-4b5c-8d9e-0f1a2b3c4d5e",
            "labels": {"team": "ml"},
            "finalizers": ["resource.kubernetes.io/delete-protection"],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 '
                                        '80GB HBM3"'
                                    }
                                }
                            ],
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "tolerations": [{"key": "example.com/maintenance", "operator": "Exists"}],
                        },
                    },
                    {
                        "name": "mig",
                        "firstAvailable": [
                            {"name": "big", "deviceClassName": "mig.nvidia.com", "allocationMode": "All"},
                            {
                                "name": "small",
                                "deviceClassName": "mig.nvidia.com",
                                "allocationMode": "ExactCount",
                                "count": 1,
                                "capacity": {"requests": {"memory": "10Gi"}},
                            },
                        ],
                    },
                ],
                "constraints": [{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}],
                "config": [
                    {
                        "requests": ["gpus"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "MPS"}}},
                    }
                ],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpus",
                            "driver": "gpu.nvidia.com",
                            "pool": "node-1",
                            "device": "gpu-0",
                            "tolerations": [{"key": "example.com/maintenance", "operator": "Exists"}],
                        },
                        {
                            "request": "gpus",
                            "driver": "gpu.nvidia.com",
                            "pool": "node-1",
                            "device": "gpu-1",
                            "tolerations": [{"key": "example.com/maintenance", "operator": "Exists"}],
                        },
                        {
                            "request": "mig/small",
                            "driver": "gpu.nvidia.com",
                            "pool": "node-1",
                            "device": "gpu-2",
                            "shareID": "6f1c1b52-6a39-4c55-9d0f-5b8d3c2b9e11",
                            "consumedCapacity": {"memory": "10Gi"},
                        },
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": ["gpus"],
                            "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "MPS"}}},
                        }
                    ],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "4a4f3c2e-1b0d-4e6f-9a8b-7c6d5e4f3a2b"}],
        },
    }
    json.dumps(encoded)  # only JSON types


def test_round_trip_through_the_decoder() -> None:
    """Guards: decode(encode(claim)) gives back the same claim, through YAML text as `simulate -o yaml` prints it."""
    claim = decode.load_text(ALLOCATED).resource_claims[0]
    again = decode.load_text(yaml.safe_dump(encode.resource_claim(claim))).resource_claims[0]
    assert again.meta == claim.meta and again.spec == claim.spec
    assert again.allocation == claim.allocation and again.reserved_for == claim.reserved_for


def test_unallocated_claim_has_empty_status() -> None:
    """Guards: like the API server, a pending claim has `status: {}` and no allocation or reservedFor keys."""
    claim = model.ResourceClaim(
        meta=model.ObjectMeta(name="pending", namespace="default"),
        spec=model.ResourceClaimSpec(
            requests=(model.DeviceRequest("gpu", exactly=model.ExactDeviceRequest("gpu.nvidia.com")),)
        ),
    )
    encoded = encode.resource_claim(claim)
    assert encoded["status"] == {}
    assert encoded["spec"] == {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1},
                }
            ]
        }
    }


def test_allocation_result_for_allocator_output() -> None:
    """Guards: admin access is written only when true, binding conditions are copied,
    and a None node selector is omitted."""
    result = model.AllocationResult(
        results=(
            model.DeviceRequestAllocationResult(
                request="monitor",
                driver="gpu.nvidia.com",
                pool="node-1",
                device="gpu-0",
                admin_access=True,
                binding_conditions=("example.com/attached",),
                binding_failure_conditions=("example.com/failed",),
            ),
            model.DeviceRequestAllocationResult(
                request="gpu", driver="gpu.nvidia.com", pool="node-1", device="gpu-1", admin_access=False
            ),
        ),
        allocation_timestamp="2026-11-21T13:00:00Z",
    )
    assert encode.allocation_result(result) == {
        "devices": {
            "results": [
                {
                    "request": "monitor",
                    "driver": "gpu.nvidia.com",
                    "pool": "node-1",
                    "device": "gpu-0",
                    "adminAccess": True,
                    "bindingConditions": ["example.com/attached"],
                    "bindingFailureConditions": ["example.com/failed"],
                },
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-1"},
            ]
        },
        "allocationTimestamp": "2026-11-21T13:00:00Z",
    }
