"""A whole cluster on this machine for the real-node suite: a control plane and one or more real nodes.

What it does: starts the test control plane of tests/controlplane.py the way a cluster runs it (Node and
RBAC authorization, an audit log of every request, kube-controller-manager and kube-scheduler, the API
server reaching kubelets by InternalIP only) and real nodes beside it (e2e/realnode.py), each with the
images it is given; reads a node's files; gathers every daemon's log for a failure report.

What it must not do: outlive its `with` block (`running`), or talk to the API server other than
through dractl.kube.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence

import controlplane
import node_images
import realnode
import scenarios

from dractl.kube import client

# Every request at Metadata level: who asked what, and the answer's code (the "no 403" checks read it).
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


@dataclasses.dataclass(slots=True)
class RealCluster:
    """A running control plane (admin client `api`) and its real nodes by name; `began` is its start (monotonic)."""

    plane: controlplane.ControlPlane
    components: controlplane.Components
    api: client.Client
    nodes: dict[str, realnode.RealNode]
    began: float
    audit_log: pathlib.Path

    def audit(self) -> list[dict[str, object]]:
        """The audit events so far (one JSON object per line of the API server's audit log)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def node(self, name: str) -> realnode.RealNode:
        return self.nodes[name]

    def cdi_files(self, node: str) -> list[str]:
        """The CDI spec files on `node` (its /var/run/cdi)."""
        return self.nodes[node].cdi_files()

    def read(self, node: str, path: str) -> str:
        """A file's text on `node`, as its containers see the host."""
        return self.nodes[node].read(path)

    def exists(self, node: str, path: str) -> bool:
        return self.nodes[node].exists(path)

    def failure_report(self) -> str:
        """The tails of every daemon's log (control plane and nodes) and of every container in the release
        namespace, and where each pod is: what a failing test's report shows."""
        parts = [f"--- {process.name}:\n{process.tail(40)}" for process in self.plane.processes]
        parts += [f"--- {process.name}:\n{process.tail(40)}" for process in self.components.processes]
        parts += [node.logs(60) for node in self.nodes.values()]
        parts.append(scenarios.pod_logs(self.api))
        return "\n".join(parts)


@contextlib.contextmanager
def running(
    nodes: Mapping[str, Mapping[str, str]], *, preload: Sequence[node_images.Image] = ()
) -> Iterator[RealCluster]:
    """`with running({"gpu-a100": labels}) as cluster:` a control plane and Ready real nodes with those labels and
    `preload` imported; everything stopped on exit. Raises `realnode.Unavailable` or `controlplane.Unavailable`."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        directory = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dractl-cluster-")))
        policy = directory / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        plane = stack.enter_context(
            controlplane.running(
                authorization="Node,RBAC",
                apiserver_args=[
                    # The node agent's pods are privileged (the kubelet's directories, /dev, MIG, MPS).
                    "--allow-privileged=true",
                    # Kubelets are reached at the InternalIP the nodes are given (127.0.0.1), never by name.
                    "--kubelet-preferred-address-types",
                    "InternalIP",
                    "--audit-policy-file",
                    str(policy),
                    "--audit-log-path",
                    str(directory / "audit.log"),
                    "--audit-log-format",
                    "json",
                ],
            )
        )
        components = plane.start_components()
        stack.callback(components.stop)
        api = client.connect(plane.kubeconfig)
        stack.callback(api.close)
        cluster = RealCluster(
            plane=plane, components=components, api=api, nodes={}, began=began, audit_log=directory / "audit.log"
        )
        for name, labels in nodes.items():
            node = realnode.RealNode.start(plane, name=name, api=api, preload=preload, labels=labels)
            stack.callback(node.stop)
            cluster.nodes[name] = node
        yield cluster
