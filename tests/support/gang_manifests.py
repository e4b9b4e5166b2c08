"""Racks of GPU nodes, PodGroups and the pods that join them, written as manifests for gang tests.

A plain module (not a conftest) so that tests import its helpers by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from support import simulate_manifests

CLASS = simulate_manifests.CLASS


def racks(layout: Mapping[str, Sequence[tuple[str, int]]], *, block: Mapping[str, str] | None = None) -> str:
    """The class, and per rack its nodes (name, GPUs), each Node labelled `rack: <rack>` (and `block: ...` where
    `block` maps the rack to one), each node's GPUs in one slice of its own pool."""
    documents = [CLASS]
    for rack, nodes in layout.items():
        labels = f"rack: {rack}" + (f", block: {block[rack]}" if block and rack in block else "")
        for node, gpus in nodes:
            documents.append(f"apiVersion: v1\nkind: Node\nmetadata: {{name: {node}, labels: {{{labels}}}}}\n")
            devices = "devices:\n" + "\n".join(f"- {{name: gpu-{i}}}" for i in range(gpus))
            documents.append(simulate_manifests.resource_slice(f"{node}-gpus", node=node, spec=devices))
    return "\n---\n".join(documents)


def template(gpus: int, *, name: str = "gpus", namespace: str = "ml") -> str:
    """A ResourceClaimTemplate for `gpus` GPUs of the class."""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.example.com, count: {gpus}}}
"""


def gang(name: str, min_count: int, *, topology: str | None = None, namespace: str = "ml") -> str:
    """A scheduling.k8s.io/v1alpha2 PodGroup with a gang minimum and, optionally, one topology key."""
    constraints = f"\n  schedulingConstraints:\n    topology: [{{key: {topology}}}]" if topology else ""
    return f"""
apiVersion: scheduling.k8s.io/v1alpha2
kind: PodGroup
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  schedulingPolicy:
    gang: {{minCount: {min_count}}}{constraints}
"""


def job(name: str, pods: int, *, group: str, template_name: str = "gpus", namespace: str = "ml") -> str:
    """A Job of `pods` pods, each with a claim from `template_name`, joining the v1alpha2 PodGroup `group`."""
    return f"""
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  parallelism: {pods}
  template:
    spec:
      schedulingGroup: {{podGroupName: {group}}}
      restartPolicy: Never
      resourceClaims:
      - {{name: gpus, resourceClaimTemplateName: {template_name}}}
      containers:
      - name: trainer
        image: trainer
        resources:
          claims: [{{name: gpus}}]
"""
