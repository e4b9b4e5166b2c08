"""Small clusters for simulate tests, written as manifests and decoded like user input.

A plain module (not a conftest) so that tests import its helpers by name."""

from __future__ import annotations

import textwrap

from dractl import model
from dractl.model import decode

# A DeviceClass for every device of the test driver.
CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
"""

# The Node objects of the two nodes, labelled pool=small and pool=large.
NODES = """
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {pool: small}}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {pool: large}}
"""


def resource_slice(name: str, *, node: str, spec: str, slices: int = 1, generation: int = 1) -> str:
    """A ResourceSlice manifest of the test driver in node `node`'s pool (named like the node), one of `slices`
    of that generation; `spec` is the rest of its spec (devices, sharedCounters) as YAML, at any indentation."""
    head = textwrap.dedent(
        f"""\
        apiVersion: resource.k8s.io/v1
        kind: ResourceSlice
        metadata: {{name: {name}}}
        spec:
          driver: gpu.example.com
          pool: {{name: {node}, generation: {generation}, resourceSliceCount: {slices}}}
          nodeName: {node}
        """
    )
    return head + textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ") + "\n"


def _field(name: str, block: str) -> str:
    return f"{name}:\n" + textwrap.dedent(block).strip("\n")


def _gpu(index: int, model: str, memory: str) -> str:
    attributes = f"{{model: {{string: {model}}}}}"
    return f"- {{name: gpu-{index}, attributes: {attributes}, capacity: {{memory: {{value: {memory}}}}}}}"


# Two GPUs on each node: node-a's are model "small" with 40Gi, node-b's model "large" with 80Gi.
SLICES = "\n" + "---\n".join(
    resource_slice(f"{node}-gpus", node=node, spec=_field("devices", "\n".join(_gpu(i, model, memory) for i in (0, 1))))
    for node, model, memory in (("node-a", "small", "40Gi"), ("node-b", "large", "80Gi"))
)

CLUSTER = "\n---\n".join([CLASS, NODES, SLICES])


def partitioned(*, counters: str, devices: str) -> str:
    """The test class and node-a's pool in two slices: one with `counters` as its sharedCounters, one with
    `devices` (both YAML lists, at any indentation)."""
    return "\n---\n".join(
        [
            CLASS,
            resource_slice("node-a-counters", node="node-a", slices=2, spec=_field("sharedCounters", counters)),
            resource_slice("node-a-devices", node="node-a", slices=2, spec=_field("devices", devices)),
        ]
    )


LARGE = 'device.attributes["gpu.example.com"].model == "large"'


def _devices(count: int, selector: str | None) -> str:
    """A claim spec's `devices`: one request `gpu` for `count` devices of the test class, matching `selector`."""
    selectors = f", selectors: [{{cel: {{expression: '{selector}'}}}}]" if selector else ""
    return textwrap.dedent(
        f"""\
        devices:
          requests:
          - name: gpu
            exactly: {{deviceClassName: gpu.example.com, count: {count}{selectors}}}
        """
    )


def claim(name: str, *, count: int = 1, selector: str | None = None) -> str:
    """A ResourceClaim manifest asking for `count` devices of the test class."""
    head = textwrap.dedent(
        f"""
        apiVersion: resource.k8s.io/v1
        kind: ResourceClaim
        metadata: {{name: {name}}}
        spec:
        """
    )
    return head + textwrap.indent(_devices(count, selector), "  ")


def template(name: str, *, count: int = 1, selector: str | None = None) -> str:
    """A ResourceClaimTemplate manifest asking for `count` devices of the test class."""
    head = textwrap.dedent(
        f"""
        apiVersion: resource.k8s.io/v1
        kind: ResourceClaimTemplate
        metadata: {{name: {name}, labels: {{team: ml}}, annotations: {{note: from-template}}}}
        spec:
          metadata: {{labels: {{claim-label: x}}, annotations: {{claim-note: noted}}}}
          spec:
        """
    )
    return head + textwrap.indent(_devices(count, selector), "    ")


def pod(
    name: str, *, claims: dict[str, str] | None = None, templates: dict[str, str] | None = None, extra: str = ""
) -> str:
    """A Pod manifest; `claims` maps pod claim names to ResourceClaim names, `templates` to
    ResourceClaimTemplate names. `extra` is more of the pod spec, as YAML flow entries."""
    entries = [f"{{name: {k}, resourceClaimName: {v}}}" for k, v in (claims or {}).items()]
    entries += [f"{{name: {k}, resourceClaimTemplateName: {v}}}" for k, v in (templates or {}).items()]
    uses = ", ".join(f"{{name: {k}}}" for k in [*(claims or {}), *(templates or {})])
    return textwrap.dedent(
        f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}}}
        spec:
          resourceClaims: [{", ".join(entries)}]
          containers: [{{name: main, image: busybox, resources: {{claims: [{uses}]}}}}]
          {extra}
        """
    )


def load(*documents: str) -> model.Objects:
    """Decode manifests as `dractl simulate -f` would."""
    return decode.load_text("\n---\n".join(documents), file="test.yaml")
