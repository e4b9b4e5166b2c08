"""One test's nodes with GPUs, for the tests of dractl's scheduler against a real kube-apiserver.

What it does: `Group` makes Ready nodes carrying a label of the group's own and a taint only its
pods tolerate, publishes for each the ResourceSlices of an example node (`dractl/examples/2*.yaml`,
renamed), and creates pods that select those nodes, so pods of other tests never land on them;
`ensure_device_classes` creates the example DeviceClasses. Every method issues exactly the
requests its docstring names; `cleanup` deletes the group's nodes and slices.

What it must not do: hold fixtures (they stay in the conftest.py or test module that uses them) or
wait for anything beyond the bounded waits its methods name.
"""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

import controlplane
import yaml

import dractl
from dractl.kube import client
from support import kube_objects

EXAMPLES = pathlib.Path(dractl.__file__).parent / "examples"
GROUP_LABEL = "test.dractl.io/group"
FINALIZER = "resource.kubernetes.io/delete-protection"


def ensure_device_classes(api: client.Client) -> None:
    """Create the example DeviceClasses gpu.nvidia.com and mig.nvidia.com unless an earlier test did."""
    for document in yaml.safe_load_all((EXAMPLES / "00-deviceclasses.yaml").read_text()):
        if document and document["metadata"]["name"] in ("gpu.nvidia.com", "mig.nvidia.com"):
            try:
                api.create(client.DEVICE_CLASSES, document)
            except client.AlreadyExists:
                pass  # Made by an earlier test of the session; cluster-scoped and identical.


class Group:
    """One test's world: its namespace, its nodes (a unique label and a taint only its pods tolerate, slices copied
    from an example node under a new name) and the scheduler name its pods ask for."""

    def __init__(self, api: client.Client, *, namespace: str, scheduler_name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.scheduler_name = scheduler_name
        self.id = uuid.uuid4().hex[:8]
        self.nodes: list[str] = []

    @property
    def toleration(self) -> dict[str, str]:
        return {"key": GROUP_LABEL, "operator": "Equal", "value": self.id, "effect": "NoSchedule"}

    def node(self, example: str, *, slices: bool = True) -> str:
        """Create a node (Ready, 32 CPUs, 256Gi, 110 pods) named after `example` and, with `slices`, its slices."""
        name = f"{example}-{self.id}-{len(self.nodes)}"
        self.nodes.append(name)
        self.api.create(
            client.NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {GROUP_LABEL: self.id, "kubernetes.io/hostname": name}},
                "spec": {"taints": [{"key": GROUP_LABEL, "value": self.id, "effect": "NoSchedule"}]},
            },
        )
        kube_objects.make_ready(self.api, name)
        if slices:
            self.publish(example, name)
        return name

    def publish(self, example: str, node: str) -> None:
        """Create the example node's slices as node `node` would publish them."""
        [path] = EXAMPLES.glob(f"2*-{example}.yaml")
        for document in yaml.safe_load_all(path.read_text().replace(example, node)):
            if document:
                self.api.create(client.RESOURCE_SLICES, document)

    def pod(
        self, name: str, *, claims: list[dict[str, str]], scheduler: str = "", cpu: str = "100m", node: str = ""
    ) -> dict[str, Any]:
        """Create a pod for `scheduler` (default: the test's) that only this group's nodes take (only `node`, when
        given)."""
        selector = {GROUP_LABEL: self.id, **({"kubernetes.io/hostname": node} if node else {})}
        placement = {
            "schedulerName": scheduler or self.scheduler_name,
            "nodeSelector": selector,
            "tolerations": [self.toleration],
        }
        body = kube_objects.pod(name, namespace=self.namespace, claims=claims, cpu=cpu, **placement)
        return self.api.create(client.PODS, body)

    def template(self, name: str, spec: dict[str, Any]) -> None:
        self.api.create(
            client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(name, namespace=self.namespace, spec=spec)
        )

    def claim(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.api.create(client.RESOURCE_CLAIMS, kube_objects.claim(name, namespace=self.namespace, spec=spec))

    def get_claim(self, name: str) -> dict[str, Any]:
        return self.api.get(client.RESOURCE_CLAIMS, name, namespace=self.namespace)

    def allocate(self, name: str, *, node: str, devices: list[str], pod: dict[str, Any] | None = None) -> None:
        """Write claim `name`'s allocation on `node` as a scheduler would (with `pod`: the finalizer, and the pod
        reserved)."""
        status: dict[str, Any] = {"allocation": kube_objects.allocation(node, devices, node=node)}
        if pod is not None:
            self.api.patch(
                client.RESOURCE_CLAIMS, name, namespace=self.namespace, patch={"metadata": {"finalizers": [FINALIZER]}}
            )
            status["reservedFor"] = kube_objects.reserved_for([pod])
        self.api.patch(
            client.RESOURCE_CLAIMS, name, namespace=self.namespace, subresource="status", patch={"status": status}
        )

    def get_pod(self, name: str) -> dict[str, Any]:
        return self.api.get(client.PODS, name, namespace=self.namespace)

    def bound(self, pod: str) -> str:
        """The node pod `pod` is bound to, or ""."""
        return str(self.get_pod(pod)["spec"].get("nodeName") or "")

    def wait_bound(self, pod: str, *, timeout: float = 60.0) -> str:
        """The node pod `pod` is bound to, once it is (a bounded wait)."""
        return controlplane.wait_until(lambda: self.bound(pod), what=f"pod {pod} is bound", timeout=timeout)

    def scheduled_condition(self, pod: str) -> dict[str, Any] | None:
        for condition in (self.get_pod(pod).get("status") or {}).get("conditions") or ():
            if condition["type"] == "PodScheduled":
                return dict(condition)
        return None

    def wait_condition(self, pod: str) -> dict[str, Any]:
        """Pod `pod`'s PodScheduled condition, once it has one (a bounded wait)."""
        return controlplane.wait_until(
            lambda: self.scheduled_condition(pod), what=f"pod {pod} has a PodScheduled condition"
        )

    def pod_claim(self, pod: str, pod_claim: str = "gpu") -> dict[str, Any]:
        """The claim pod `pod` uses for `pod_claim` (direct or recorded)."""
        raw = self.get_pod(pod)
        for entry in raw["spec"].get("resourceClaims") or ():
            if entry["name"] == pod_claim and entry.get("resourceClaimName"):
                return self.get_claim(entry["resourceClaimName"])
        for entry in (raw.get("status") or {}).get("resourceClaimStatuses") or ():
            if entry["name"] == pod_claim:
                return self.get_claim(entry["resourceClaimName"])
        raise AssertionError(f"pod {pod} has no claim {pod_claim}")

    def events(self, pod: str, reason: str) -> list[dict[str, Any]]:
        return [
            event
            for event in self.api.list(client.EVENTS, namespace=self.namespace).items
            if event["involvedObject"].get("name") == pod and event["reason"] == reason
        ]

    def cleanup(self) -> None:
        for name in self.nodes:
            for item in self.api.list(client.RESOURCE_SLICES, field_selector=f"spec.nodeName={name}").items:
                try:
                    self.api.delete(client.RESOURCE_SLICES, item["metadata"]["name"])
                except client.NotFound:
                    pass
            try:
                self.api.delete(client.NODES, name)
            except client.NotFound:
                pass
