"""The Helm chart (charts/dractl) as the tests see it: rendered by Helm's own engine, as API objects.

What it does: `render(values)` renders the chart with helm-python-sdk (Helm 4's Go engine in a
shared library: the same template functions, values coalescing and values.schema.json check as
`helm template`) and returns the objects it makes, in file order; `find` picks one by kind and
name; `VALUE_SETS` are the value sets the tests render (each one a way the chart is installed).

What it must not do: change what the engine rendered, or talk to a cluster (the integration tests
install with `helm_python.Config`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import helm_python
import yaml

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "dractl"
RELEASE = "dractl"
NAMESPACE = "dractl-system"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "fake-dynamic-mig": {
        "nodeAgent": {
            "deviceSource": "fake",
            "fakeProfile": "a100-80gb-x8",
            "migMode": "dynamic",
            "nodeSelector": {},
        },
        "logFormat": "console",
    },
    "consumable-memory": {"nodeAgent": {"deviceSource": "fake", "fakeProfile": "l4-x4", "consumableMemory": True}},
    "both-controllers-first-fit": {
        "controller": {
            "controllers": ["claims", "scheduler"],
            "policy": "first-fit",
            "topologyLevels": ["example.com/block", "rack", "kubernetes.io/hostname"],
            "replicas": 3,
            "namespace": "ml",
            "metricsPort": -1,
        },
        "nodeAgent": {"metricsPort": -1},
    },
    "claims-only-no-leader-election": {
        "controller": {
            "controllers": ["claims"],
            "leaderElection": {"enabled": False},
            "podDisruptionBudget": {"enabled": False},
        },
        "metrics": {"service": {"enabled": False}},
    },
    "node-agent-only": {"controller": {"enabled": False}, "deviceClasses": {"enabled": False}},
    "controller-only": {"nodeAgent": {"enabled": False}, "opaqueConfigPolicy": {"enabled": False}},
    "second-release": {
        "driverName": "gpu.e2e.example.com",
        "fullnameOverride": "dractl-e2e",
        "image": {"repository": "localhost/dractl", "tag": "dev", "pullPolicy": "Never"},
        "deviceClasses": {
            "gpu": {"name": "gpu.e2e.example.com", "extendedResourceName": ""},
            "mig": {"name": "mig.e2e.example.com"},
        },
        "nodeAgent": {"driverRoot": "/run/nvidia/driver", "kubeletPluginsDir": "/var/lib/k0s/kubelet/plugins"},
    },
}


def render(
    values: Mapping[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """The chart's objects for `values`, in template file order (NOTES.txt left out). Raises helm_python's errors."""
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(dict(values or {}), name=release, namespace=namespace)
    return [
        document
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for document in yaml.safe_load_all(text)
        if document
    ]


def notes(values: Mapping[str, Any] | None = None) -> str:
    """The rendered NOTES.txt."""
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(dict(values or {}), name=RELEASE, namespace=NAMESPACE)
    return manifests[f"{CHART.name}/templates/NOTES.txt"]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    """The objects of `kind` (and `name`), in order."""
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
