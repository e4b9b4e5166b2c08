"""dractl's chart (charts/dractl) installed, upgraded and uninstalled with Helm's own engine.

What it does: `values` reads the suites' releases (e2e/values/: one per kind of fake GPU node);
`install`, `upgrade` and `uninstall` run Helm 4's actions through helm-python-sdk (the Go
SDK in a shared library, no helm binary), as `helm install/upgrade/uninstall` would: a release
history in Secrets, server-side apply. `loopback_network` is the policy a cluster on this machine
needs for dractl's pods: only loopback traffic is allowed here and pods get a network namespace
with only `lo`, so a MutatingAdmissionPolicy puts the release namespace's pods on the host network
and points their in-cluster client at the API server on 127.0.0.1 (KUBERNETES_SERVICE_HOST/PORT,
which the kubelet would otherwise set to the `kubernetes` Service's cluster IP, which no proxy
serves here). The chart itself is not changed.

What it must not do: change the chart's output in any other way, or wait for pods (the tests do).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import helm_python
import yaml

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE.parent / "charts" / "dractl"
NAMESPACE = "dractl"
TIMEOUT = 120  # seconds for one Helm action (it does not wait for pods)
# The suites' releases and their values files: one release per kind of (fake) GPU node.
RELEASES = {"dractl": HERE / "values" / "a100.yaml", "dractl-t4": HERE / "values" / "t4.yaml"}
# The node labels those values select on.
GPU_LABEL = "nvidia.com/gpu.present"
PROFILE_LABEL = "e2e.dractl.dev/fake-profile"


def values(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Release `name`'s values file with `overrides` merged in (maps merged key by key, as Helm merges values)."""
    return _merged(yaml.safe_load(RELEASES[name].read_text()), overrides or {})


def _merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def app_version() -> str:
    """The chart's appVersion: the image tag its pods run unless `image.tag` is set."""
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def _config(kubeconfig: pathlib.Path) -> helm_python.Config:
    return helm_python.Config(kubeconfig_path=str(kubeconfig), namespace=NAMESPACE)


def install(kubeconfig: pathlib.Path, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """`helm install <name> charts/dractl -n dractl --create-namespace` with `values`; the release summary."""
    with _config(kubeconfig) as config, helm_python.Chart.load(CHART) as chart:
        return dict(
            config.install(chart, name, dict(values), namespace=NAMESPACE, create_namespace=True, timeout=TIMEOUT)
        )


def upgrade(kubeconfig: pathlib.Path, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """`helm upgrade <name> charts/dractl -n dractl` with `values` (not reused from the last revision)."""
    with _config(kubeconfig) as config, helm_python.Chart.load(CHART) as chart:
        return dict(config.upgrade(chart, name, dict(values), namespace=NAMESPACE, timeout=TIMEOUT))


def uninstall(kubeconfig: pathlib.Path, name: str) -> None:
    """`helm uninstall <name> -n dractl`; a release already gone is fine."""
    with _config(kubeconfig) as config:
        config.uninstall(name, timeout=TIMEOUT, ignore_not_found=True)


def loopback_network(*, port: int, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding: every pod created in `namespace` runs on the host network
    (each container port published at the same host port, as the API server requires there), with
    KUBERNETES_SERVICE_HOST=127.0.0.1 and KUBERNETES_SERVICE_PORT=`port` in every container."""
    env = (
        f'[Object.spec.containers.env{{name: "KUBERNETES_SERVICE_HOST", value: "127.0.0.1"}}, '
        f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{port}"}}]'
    )
    expression = (
        "Object{spec: Object.spec{"
        'hostNetwork: true, dnsPolicy: "ClusterFirstWithHostNet", '
        "containers: object.spec.containers.map(c, Object.spec.containers{"
        f"name: c.name, env: {env}, "
        "ports: c.?ports.orValue([]).map(p, Object.spec.containers.ports{"
        'containerPort: p.containerPort, protocol: p.?protocol.orValue("TCP"), hostPort: p.containerPort})'
        "})}}"
    )
    name = f"{namespace}-loopback-network"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ]
                },
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                },
            },
        },
    ]
