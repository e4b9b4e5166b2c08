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

# Two GPUs on each node: node-a's are model "small" with 40Gi, node-b's model "large" with 80Gi.
SLICES = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-a-gpus}
spec:
  driver: gpu.example.com
  pool: {name: node-a, generation: 1, resourceSliceCount: 1}
  nodeName: node-a
  devices:
  - {name: gpu-0, attributes: {model: {string: small}}, capacity: {memory: {value: 40Gi}}}
  - {name: gpu-1, attributes: {model: {string: small}}, capacity: {memory: {value: 40Gi}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-b-gpus}
spec:
  driver: gpu.example.com
  pool: {name: node-b, generation: 1, resourceSliceCount: 1}
  nodeName: node-b
  devices:
  - {name: gpu-0, attributes: {model: {string: large}}, capacity: {memory: {value: 80Gi}}}
  - {name: gpu-1, attributes: {model: {string: large}}, capacity: {memory: {value: 80Gi}}}
"""

CLUSTER = "\n---\n".join([CLASS, NODES, SLICES])
LARGE = 'device.attributes["gpu.example.com"].model == "large"'


def claim(name: str, *, count: int = 1, selector: str | None = None) -> str:
    """A ResourceClaim manifest asking for `count` devices of the test class."""
    selectors = f", selectors: [{{cel: {{expression: '{selector}'}}}}]" if selector else ""
    return textwrap.dedent(
        f"""
        apiVersion: resource.k8s.io/v1
        kind: ResourceClaim
        metadata: {{name: {name}}}
        spec:
          devices:
            requests:
            - name: gpu
              exactly: {{deviceClassName: gpu.example.com, count: {count}{selectors}}}
        """
    )


def template(name: str, *, count: int = 1, selector: str | None = None) -> str:
    """A ResourceClaimTemplate manifest asking for `count` devices of the test class."""
    selectors = f", selectors: [{{cel: {{expression: '{selector}'}}}}]" if selector else ""
    return textwrap.dedent(
        f"""
        apiVersion: resource.k8s.io/v1
        kind: ResourceClaimTemplate
        metadata: {{name: {name}, labels: {{team: ml}}, annotations: {{note: from-template}}}}
        spec:
          metadata: {{labels: {{claim-label: x}}, annotations: {{claim-note: noted}}}}
          spec:
            devices:
              requests:
              - name: gpu
                exactly: {{deviceClassName: gpu.example.com, count: {count}{selectors}}}
        """
    )


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
