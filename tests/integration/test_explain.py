"""`dractl explain claim|pod` against the real kube-apiserver: the CLI reads the live state and explains it.

Every test makes its own driver, DeviceClass, Nodes and ResourceSlices, named after its
namespace, so the class selects only the test's devices whatever other tests left in the
cluster. Pods name a scheduler that does not run, so a kube-scheduler started by another
test never allocates their claims behind the test's back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import controlplane
import faultproxy
import pytest
import yaml
from click.testing import CliRunner
from support import crds

from dractl import cli
from dractl.kube import client

pytestmark = pytest.mark.timeout(120)

RESOURCE_QUOTAS = client.Resource("", "v1", "resourcequotas", "ResourceQuota", namespaced=True)
NO_SCHEDULER = "dractl-explain-test-nobody"  # no scheduler by that name runs: pods stay pending


class Gpus:
    """The test's cluster-scoped objects: a driver and class named after the namespace, and
    node-a and node-b with two GPUs each (models small and large), the nodes labelled
    `<namespace>.example.com/pool` small and large, a label no other test's Node carries."""

    def __init__(self, kube: client.Client, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.driver = f"{namespace}.example.com"
        self.node_a = f"{namespace}-node-a"
        self.node_b = f"{namespace}-node-b"
        self.pool_label = f"{self.driver}/pool"
        self.created: list[tuple[client.Resource, str]] = []

    def create(self) -> None:
        self._create(
            client.DEVICE_CLASSES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": self.driver},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{self.driver}"'}}]},
            },
        )
        for node, pool in ((self.node_a, "small"), (self.node_b, "large")):
            self._create(
                client.NODES,
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {self.pool_label: pool}}},
            )
            self._create(
                client.RESOURCE_SLICES,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{node}-gpus"},
                    "spec": {
                        "driver": self.driver,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": f"gpu-{i}", "attributes": {"model": {"string": pool}}} for i in range(2)],
                    },
                },
            )

    def _create(self, resource: client.Resource, body: dict[str, Any]) -> None:
        self.kube.create(resource, body)
        self.created.append((resource, body["metadata"]["name"]))

    def delete(self) -> None:
        for resource, name in reversed(self.created):
            try:
                self.kube.delete(resource, name)
            except client.NotFound:
                pass  # Already gone: nothing to clean up.

    def claim(self, name: str, *, count: int = 1, selector: str | None = None) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": self.driver, "count": count}
        if selector is not None:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        return self.kube.create(
            client.RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            },
        )

    def allocate(self, claim: dict[str, Any], *, node: str, devices: list[str], pod: dict[str, Any]) -> None:
        """Write an allocation on `node` and reserve the claim for `pod`, as a scheduler would."""
        status = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": self.driver, "pool": node, "device": device} for device in devices
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
        }
        self.kube.update_status(client.RESOURCE_CLAIMS, {**claim, "status": status})

    def pod(
        self,
        name: str,
        *,
        claims: dict[str, str] | None = None,
        templates: dict[str, str] | None = None,
        node_selector: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        entries = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
        entries += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
        spec: dict[str, Any] = {
            "schedulerName": NO_SCHEDULER,
            "resourceClaims": entries,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": e["name"]} for e in entries]}}
            ],
        }
        if node_selector:
            spec["nodeSelector"] = node_selector
        return self.kube.create(
            client.PODS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": self.namespace}, "spec": spec},
        )


@pytest.fixture
def gpus(kube_client: client.Client, namespace: str) -> Iterator[Gpus]:
    made = Gpus(kube_client, namespace)
    try:
        made.create()
        yield made
    finally:
        made.delete()


def _explain(kubeconfig: Any, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, ["explain", *args, "--kubeconfig", str(kubeconfig)], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_a_claim_that_fits_then_allocated(control_plane: controlplane.ControlPlane, gpus: Gpus) -> None:
    """Guards: a pending claim that fits is shown with the devices it would get; once an allocation is written, the
    same command shows its node, devices and the pod that reserves it."""
    large = f'device.attributes["{gpus.driver}"].model == "large"'
    claim = gpus.claim("train", count=2, selector=large)
    code, out, err = _explain(control_plane.kubeconfig, "claim", f"{gpus.namespace}/train")
    assert (code, err) == (0, "")
    assert out.startswith(f"ResourceClaim {gpus.namespace}/train: pending, fits on node {gpus.node_b} ")
    assert f"would get: {gpus.driver}/{gpus.node_b}/gpu-0, {gpus.driver}/{gpus.node_b}/gpu-1" in out

    pod = gpus.pod("trainer", claims={"gpu": "train"})
    gpus.allocate(claim, node=gpus.node_b, devices=["gpu-0", "gpu-1"], pod=pod)
    code, out, err = _explain(control_plane.kubeconfig, "claim", f"{gpus.namespace}/train", "-o", "json")
    assert (code, err) == (0, "")
    explained = json.loads(out)["claim"]
    assert (explained["status"], explained["nodes"], explained["reservedFor"]) == (
        "allocated",
        [gpus.node_b],
        ["pods/trainer"],
    )
    assert [d["device"] for d in explained["requests"][0]["devices"]] == ["gpu-0", "gpu-1"]


def test_a_claim_that_cannot_fit_names_the_request_and_why(
    control_plane: controlplane.ControlPlane, gpus: Gpus
) -> None:
    """Guards: a claim no node can hold is explained per request (class, selector stage, free devices), and a claim
    allocated in the cluster holds its devices against it."""
    holder = gpus.claim("holder", count=2, selector=f'device.attributes["{gpus.driver}"].model == "large"')
    gpus.allocate(holder, node=gpus.node_b, devices=["gpu-0", "gpu-1"], pod=gpus.pod("p0", claims={"g": "holder"}))
    gpus.claim("three", count=3)
    code, out, err = _explain(control_plane.kubeconfig, "claim", f"{gpus.namespace}/three", "-o", "yaml")
    assert (code, err) == (0, "")
    explained = yaml.safe_load(out)["claim"]
    assert explained["status"] == "pending, does not fit"
    [request] = explained["requests"]
    assert request["name"] == "gpu" and request["deviceClassName"] == gpus.driver
    assert request["reasons"] == [
        f"device class {gpus.driver} matches 4 devices; 4 pass the request's selectors; "
        "2 of those are free on the candidate nodes (3 needed)"
    ]


def test_a_pod_with_a_template_is_explained_before_its_claim_exists(
    control_plane: controlplane.ControlPlane, kube_client: client.Client, gpus: Gpus
) -> None:
    """Guards: `explain pod` explains a template's claim that is not created yet from the template, on the nodes the
    pod's nodeSelector allows. A quota of zero ResourceClaims keeps any kube-controller-manager another test started
    from creating the claim, as on a cluster whose claim controller is behind."""
    kube_client.create(
        RESOURCE_QUOTAS,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-claims", "namespace": gpus.namespace},
            "spec": {"hard": {"count/resourceclaims.resource.k8s.io": "0"}},
        },
    )
    kube_client.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": gpus.namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": gpus.driver}}]}}},
        },
    )
    gpus.pod("worker", templates={"gpu": "one-gpu"}, node_selector={gpus.pool_label: "small"})
    code, out, err = _explain(control_plane.kubeconfig, "pod", f"{gpus.namespace}/worker")
    assert (code, err) == (0, "")
    assert out.splitlines()[:6] == [
        f"Pod {gpus.namespace}/worker: claims fit on node {gpus.node_a}",
        f"  spec.nodeSelector: {gpus.pool_label}=small",
        f"  nodes it may use: {gpus.node_a}",
        "  pod claim gpu: template one-gpu",
        f"    ResourceClaim {gpus.namespace}/worker-gpu-<suffix>: pending, fits on node {gpus.node_a} (nothing is "
        "written: a scheduler allocates it)",
        "      not created yet: explained from ResourceClaimTemplate one-gpu",
    ]


def test_a_pods_claims_share_the_node_of_the_one_already_allocated(
    control_plane: controlplane.ControlPlane, gpus: Gpus
) -> None:
    """Guards: a pod's pending claim is tried on the node its allocated claim pins, and does not fit when that node
    is full even though another node has free devices."""
    first = gpus.claim("first")
    gpus.claim("second", count=2)
    pod = gpus.pod("both", claims={"a": "first", "b": "second"})
    gpus.allocate(first, node=gpus.node_a, devices=["gpu-0"], pod=pod)
    code, out, err = _explain(control_plane.kubeconfig, "pod", f"{gpus.namespace}/both", "-o", "json")
    assert (code, err) == (0, "")
    explained = json.loads(out)["pod"]
    assert (explained["status"], explained["candidateNodes"]) == ("cannot be scheduled", [gpus.node_a])
    first_view, second_view = explained["claims"]
    assert (first_view["status"], second_view["status"]) == ("allocated", "pending, does not fit")
    assert second_view["requests"][0]["reasons"] == [
        f"device class {gpus.driver} matches 4 devices; 4 pass the request's selectors; "
        "1 of those are free on the candidate nodes (2 needed)"
    ]


def test_a_claim_or_pod_that_does_not_exist_is_one_line_and_exit_1(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    """Guards: explaining a claim or pod that does not exist prints one line naming it and the server, exit 1."""
    for kind, resource in (("claim", "ResourceClaim"), ("pod", "Pod")):
        code, out, err = _explain(control_plane.kubeconfig, kind, f"{namespace}/ghost")
        assert (code, out) == (1, "")
        assert err == (
            f"dractl explain: {resource} {namespace}/ghost not found on the API server {control_plane.url}\n"
        )


def test_a_server_that_refuses_a_list_is_one_line_naming_it_and_the_resource(
    fault_proxy: faultproxy.FaultProxy, gpus: Gpus
) -> None:
    """Guards: a 403 on listing ResourceSlices (through the fault proxy) is one line naming the server and the
    resource, exit 1, nothing on stdout."""
    gpus.claim("c")
    fault_proxy.add(faultproxy.respond(403, method="GET", path="/resourceslices", count=None, reason="Forbidden"))
    code, out, err = _explain(fault_proxy.kubeconfig, "claim", f"{gpus.namespace}/c")
    assert (code, out) == (1, "")
    assert err.startswith(
        f"dractl explain: the API server https://127.0.0.1:{fault_proxy.port} refuses to list resourceslices: 403 "
    )
    assert err.count("\n") == 1


def _gang_pods(gpus: Gpus, count: int, *, join: dict[str, Any]) -> None:
    """`count` pods of one GPU each (template one-gpu), joining a PodGroup as `join` says (a schedulingGroup field
    or labels)."""
    gpus.kube.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": gpus.namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": gpus.driver}}]}}},
        },
    )
    for i in range(count):
        spec: dict[str, Any] = {
            "schedulerName": NO_SCHEDULER,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            **join.get("spec", {}),
        }
        meta = {"name": f"worker-{i}", "namespace": gpus.namespace, **join.get("metadata", {})}
        gpus.kube.create(client.PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def test_a_member_of_a_v1alpha2_gang_is_explained_with_its_gang(
    control_plane: controlplane.ControlPlane, gpus: Gpus
) -> None:
    """Guards: the test control plane serves scheduling.k8s.io/v1alpha2; `explain pod` of a member of a 3-pod gang
    (one GPU each, topology key the pool label: 2 GPUs per pool) reads the PodGroup and the other members and prints
    the gang planner's line; the pod cannot be scheduled though its own claim would fit alone."""
    gpus.kube.create(
        client.POD_GROUPS,
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": gpus.namespace},
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": 3}},
                "schedulingConstraints": {"topology": [{"key": gpus.pool_label}]},
            },
        },
    )
    _gang_pods(gpus, 3, join={"spec": {"schedulingGroup": {"podGroupName": "train"}}})
    code, out, err = _explain(control_plane.kubeconfig, "pod", f"{gpus.namespace}/worker-0", "-o", "json")
    assert (code, err) == (0, "")
    pod = json.loads(out)["pod"]
    line = (
        f"gang {gpus.namespace}/train (minCount 3, topology {gpus.pool_label}): no {gpus.pool_label} fits 3 pods; "
        f"best large fits 2: 1 pod short, 1 device of class {gpus.driver}"
    )
    assert pod["gang"] == {
        "podGroup": f"{gpus.namespace}/train",
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "members": ["worker-0", "worker-1", "worker-2"],
        "bound": [],
        "fits": False,
        "left": [],
        "reason": line,
    }
    assert (pod["status"], pod["reasons"]) == ("cannot be scheduled", [line])
    code, out, err = _explain(control_plane.kubeconfig, "pod", f"{gpus.namespace}/worker-2")
    assert (code, err) == (0, "")
    assert f"  gang: {line}" in out.splitlines()


def test_a_coscheduling_gang_is_read_once_its_crd_is_installed(
    control_plane: controlplane.ControlPlane, kube_client: client.Client, gpus: Gpus
) -> None:
    """Guards: a pod labelled scheduling.x-k8s.io/pod-group is explained as not served while the coscheduling CRD
    is missing (discovered from the server, not assumed), and with its gang (minMember) once the CRD is installed."""
    _gang_pods(gpus, 2, join={"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "seed"}}})
    code, out, err = _explain(control_plane.kubeconfig, "pod", f"{gpus.namespace}/worker-0", "-o", "json")
    assert (code, err) == (0, "")
    assert json.loads(out)["pod"]["gang"]["reason"] == (
        f"PodGroup {gpus.namespace}/seed (scheduling.x-k8s.io/v1alpha1): the API server {control_plane.url} does not "
        "serve it (its CustomResourceDefinition (scheduler-plugins' coscheduling) is not installed)"
    )
    with crds.installed(kube_client):
        kube_client.create(
            client.COSCHEDULING_POD_GROUPS,
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "seed", "namespace": gpus.namespace},
                "spec": {"minMember": 2, "scheduleTimeoutSeconds": 300},
            },
        )
        code, out, err = _explain(control_plane.kubeconfig, "pod", f"{gpus.namespace}/worker-1", "-o", "json")
        assert (code, err) == (0, "")
        gang = json.loads(out)["pod"]["gang"]
        assert (gang["apiVersion"], gang["members"], gang["fits"]) == (
            "scheduling.x-k8s.io/v1alpha1",
            ["worker-0", "worker-1"],
            True,
        )
        assert gang["reason"] == f"gang {gpus.namespace}/seed (minCount 2): fits, 2 of 2 member pods in the cluster"
