"""Valid manifests as dicts for the decoder tests, and a helper to mutate copies of them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any


def claim(**spec_devices: Any) -> dict[str, Any]:
    """A valid v1 ResourceClaim default/train with one request `gpu`; keyword arguments replace spec.devices entries."""
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
    devices.update(spec_devices)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train"},
        "spec": {"devices": devices},
    }


def device(name: str = "gpu-0", **fields: Any) -> dict[str, Any]:
    """A valid v1 device as the NVIDIA driver publishes it; keyword arguments replace fields."""
    result: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "index": {"int": 0},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    result.update(fields)
    return result


def resource_slice(*devices: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A valid v1 ResourceSlice `node-1-gpu` on node-1; keyword arguments replace spec fields."""
    body: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "node-1",
        "devices": list(devices) if devices else [device()],
    }
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpu"},
        "spec": body,
    }


def mutated(base: dict[str, Any], change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    """A deep copy of `base` after `change` edited it in place."""
    result = copy.deepcopy(base)
    change(result)
    return result
